#!/bin/bash
# The codec step A/B on one H200 (device image's PyTorch, no vLLM): this tree (0fb5776) against
# ab_old/ = `git archive 75d8fba realtime_engine bench` (the tree before the change).
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, numpy; print('torch', torch.__version__)"
T0=$(date +%s)
run() { # dir label
  (cd "$1" && timeout 200 python3 -m bench.codec_throughput --batches 2,16,64,128,256 --precisions tf32 \
     --kernels tf32:compiled --iters 100 --out "$OUT/$2" > "$OUT/$2.log" 2>&1; echo "rc=$?" >> "$OUT/$2.log")
  grep '^{' "$OUT/$2.log"; tail -2 "$OUT/$2.log"; echo "[$2 done at $(( $(date +%s) - T0 )) s]"
}
run . new
run ab_old old
prof() {
  (cd "$1" && timeout 90 python3 -m bench.gpu.codec_profile --batch 256 --kernels compiled --out "$OUT/$2" > "$OUT/$2_prof.log" 2>&1; echo "rc=$?" >> "$OUT/$2_prof.log")
  tail -1 "$OUT/$2_prof.log"; echo "[$2 prof done at $(( $(date +%s) - T0 )) s]"
}
prof . new
prof ab_old old
