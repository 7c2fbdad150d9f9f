#!/bin/bash
# The engine core's audio hooks on one H200 (device image's PyTorch, pyzmq, no vLLM): this tree
# against .whl/ab_old/ = `git archive aa02d47 realtime_engine bench` (before sections 25-26's
# host changes), started in turn (new, old, new, old) so that the order shows.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
pip install -q --no-deps --target /tmp/pydeps .whl/wheels/pyzmq-*.whl > /dev/null 2>&1
python3 -c "import tokenizers" 2>/dev/null || echo "class Tokenizer: pass" > /tmp/pydeps/tokenizers.py
export PYTHONPATH=/tmp/pydeps
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
run() { # dir label args...
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH=/tmp/pydeps:$PWD timeout ${LIMIT:-240} python3 -m bench.gpu.audio_host "$@" \
     --out "$OUT/$label" > "$OUT/$label.log" 2>&1; echo "rc=$?" >> "$OUT/$label.log")
  python3 - "$OUT/$label/audio_host.json" <<'PY' || tail -3 "$OUT/$label.log"
import json, sys
d = json.load(open(sys.argv[1]))
print(d["slots"], "step", d["step_ms"], "hooks", d["audio_hooks_ms_per_step"], d["host_ms_per_step"])
PY
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
}
for spec in ${RUNS:-new:256 old:256 new:256b old:256b new:256x}; do
  tree=${spec%%:*}; what=${spec#*:}; slots=${what%%[a-z]*}
  dir=.; [ "$tree" = old ] && dir=.whl/ab_old
  extra=""; [[ "$what" == *x ]] && extra="--breakdown"
  run "$dir" "${tree}_${what}" --slots "$slots" --steps 1000 $extra
done
