#!/usr/bin/env bash
# Runs tests as a machine with only the default install (`bash scripts/install.sh`, no --osworld-apps, no
# --docker, no vLLM) would: the optional programs, their Debian packages and Python modules are hidden
# even where they are installed, so a test that needs one must skip (with its reason) rather than fail.
#
#   bash scripts/test_default_install.sh                      # the tests touching optional programs
#   bash scripts/test_default_install.sh tests/envs/osworld   # any pytest arguments
#
# How: PATH becomes one folder of links to every program on today's PATH but the hidden ones; a
# dpkg-query wrapper there drops the hidden packages from what dpkg reports; a sitecustomize.py makes the
# hidden Python modules fail to import. Programs reached by absolute path are not hidden (the suite has
# none: `grep -rn '"/usr/bin/' tests`), nor inside an OSWorld desktop (its sandbox sets its own PATH): what
# this proves is that every check and skip on the host side sees a default install.
set -euo pipefail
cd "$(dirname "$0")/.."

# what `install.sh --osworld-apps` and `--docker` add (programs, then packages), and the vLLM backend
PROGRAMS=(soffice libreoffice localc lowriter loimpress gimp vlc cvlc thunderbird xdg-open nautilus evince
          eog totem gedit wmctrl update-desktop-database xsel sar picard code-server code rg
          docker dockerd containerd vllm)
PACKAGES=(libreoffice-calc libreoffice-writer libreoffice-impress libreoffice-gtk3 gimp vlc thunderbird
          xdg-utils nautilus evince eog totem gedit wmctrl desktop-file-utils xsel sysstat picard
          build-essential libkrb5-dev ripgrep docker.io)
MODULES=(vllm pygame pysrt)  # the vllm extra; the osworld-tasks extra's own (the rest come with osworld)

# The links live under /usr when it is writable: the desktop sandbox (bubblewrap) binds /usr, and the host
# code hands it programs by the path shutil.which found (setpriv, Xvfb); under /tmp they are not there.
root=$(mktemp -d -p /usr/local/lib rz-default-install.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 755 "$root"  # (mktemp makes it 0700: a desktop running as its own uid must reach the links)
mkdir "$root/bin" "$root/py"
hidden=" ${PROGRAMS[*]} "
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  [ -d "$dir" ] || continue
  for prog in "$dir"/*; do
    name=${prog##*/}
    [ -x "$prog" ] && [ ! -d "$prog" ] || continue
    case "$hidden" in *" $name "*) continue ;; esac
    [ -e "$root/bin/$name" ] || ln -s "$prog" "$root/bin/$name"  # first on PATH wins, as for the shell
  done
done
if real=$(command -v dpkg-query); then
  rm -f "$root/bin/dpkg-query"
  cat >"$root/bin/dpkg-query" <<EOF
#!/bin/sh
# dpkg-query without the optional packages (scripts/test_default_install.sh)
"$real" "\$@" | awk 'BEGIN { split("${PACKAGES[*]}", h, " "); for (i in h) hide[h[i]] = 1 }
  { name = \$1; sub(/:.*/, "", name); if (!(name in hide)) print }'
EOF
  chmod +x "$root/bin/dpkg-query"
fi
cat >"$root/py/sitecustomize.py" <<EOF
"""Hide the optional Python modules (scripts/test_default_install.sh): the path finder does not see them,
so importlib.util.find_spec returns None and an import raises ModuleNotFoundError, as where not installed."""
import importlib.machinery

HIDDEN = set("${MODULES[*]}".split())
_find_spec = importlib.machinery.PathFinder.find_spec.__func__


def find_spec(cls, name, path=None, target=None):
    if name.split(".")[0] in HIDDEN:
        return None
    return _find_spec(cls, name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(find_spec)
EOF

if [ $# -eq 0 ]; then
  # every test file that names an optional program or module (not the common words: code, rg, sar, eog)
  pattern="soffice libreoffice gimp vlc thunderbird xdg-open nautilus evince totem gedit wmctrl xsel picard"
  pattern="$pattern code-server docker vllm ${MODULES[*]} osworld-apps"
  mapfile -t files < <(grep -rlwE "${pattern// /|}" tests --include='test_*.py' | sort)
  set -- "${files[@]}"
fi
echo "hidden: ${#PROGRAMS[@]} programs, ${#PACKAGES[@]} packages, modules ${MODULES[*]}; running $# path(s)" >&2
export PATH="$root/bin"
export PYTHONPATH="$root/py${PYTHONPATH:+:$PYTHONPATH}"
"${PYTHON:-python3}" -c "import shutil, sys; sys.exit(any(map(shutil.which, '${PROGRAMS[*]}'.split())))" \
  || { echo "an optional program is still on PATH" >&2; exit 1; }
"${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -rs "$@"
