#!/usr/bin/env bash
# The Docker sandbox backend without a registry (as root, Debian): installs the Docker engine, starts
# dockerd when no daemon answers (no systemd needed), and builds the sandbox image rz-python-sandbox:bookworm
# from Debian packages (debootstrap --variant=minbase --include=python3, then `docker import`).
# Idempotent: a running daemon and an existing image are kept. Called by `scripts/install.sh --docker`.
# With a registry, any image with Python 3.10+ works instead: PythonSandbox(backend="docker",
# docker_image="python:3.11-slim").
set -euo pipefail
IMAGE=${RZ_SANDBOX_IMAGE:-rz-python-sandbox:bookworm}
SUITE=${RZ_SANDBOX_SUITE:-bookworm}
MIRROR=${RZ_SANDBOX_MIRROR:-http://deb.debian.org/debian}

export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in docker.io debootstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The daemon: systemd starts it where there is one; elsewhere start it here and wait for its socket.
if ! docker info >/dev/null 2>&1; then
  if command -v systemctl >/dev/null && systemctl start docker 2>/dev/null; then :; else
    nohup dockerd >/var/log/rz-dockerd.log 2>&1 &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/rz-dockerd.log" >&2; exit 1; }
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  root=$(mktemp -d /tmp/rz-sandbox-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3 "$SUITE" "$root" "$MIRROR" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import - "$IMAGE" >/dev/null
fi
echo "docker sandbox ready: $(docker image inspect -f '{{.Id}}' "$IMAGE" | cut -c1-19) $IMAGE"
