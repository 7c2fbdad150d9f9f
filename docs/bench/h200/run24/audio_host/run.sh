#!/bin/bash
# The engine core's audio hooks on one H200 (device image's PyTorch, pyzmq, no vLLM), every chunk
# read by a reader process: as served, then with the interpreter's switch interval at 0.5 ms,
# then with the decode thread, then as served again (so that the order shows). Needs the pyzmq
# wheel in .whl/wheels/ (pip download pyzmq --only-binary :all: --python-version 3.12
# --platform manylinux_2_28_x86_64 -d .whl/wheels).
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
pip install -q --no-deps --target /tmp/pydeps .whl/wheels/pyzmq-*.whl > /dev/null 2>&1
python3 -c "import tokenizers" 2>/dev/null || echo "class Tokenizer: pass" > /tmp/pydeps/tokenizers.py
export PYTHONPATH=/tmp/pydeps:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
for spec in ${RUNS:-served switch05 thread served2}; do
  case $spec in
    served*) extra="" ;;
    switch05) extra="--switch-interval-ms 0.5" ;;
    thread) extra="--decode-thread" ;;
  esac
  timeout ${LIMIT:-240} python3 -m bench.gpu.audio_host --slots ${SLOTS:-256} --steps 1000 $extra ${EXTRA:-} \
    --out "$OUT/$spec" > "$OUT/$spec.log" 2>&1; echo "rc=$?" >> "$OUT/$spec.log"
  python3 - "$OUT/$spec/audio_host.json" <<'PY' || tail -3 "$OUT/$spec.log"
import json, sys
d = json.load(open(sys.argv[1]))
print(d["slots"], "step", d["step_ms"], "hooks", d["audio_hooks_ms_per_step"],
      "MB", round(d["bytes_received"] / 1e6), d["host_ms_per_step"])
PY
  echo "[$spec done at $(( $(date +%s) - T0 )) s]"
done
