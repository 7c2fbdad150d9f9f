#!/usr/bin/env bash
# Install (system packages + a virtualenv in .venv) and start the gateway.
#   bash scripts/serve.sh                      # CPU voice, http://127.0.0.1:8000/
#   bash scripts/serve.sh --model /path/to/higgs-audio-v3   # the Higgs talker
# Every argument goes to `speech-gateway serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_system_packages
# The server extra always; EXTRAS adds more (e.g. EXTRAS=gpu for vLLM on CUDA).
install_python_env "server${EXTRAS:+,$EXTRAS}"
exec speech-gateway serve "$@"
