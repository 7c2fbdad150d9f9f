#!/bin/bash
# The compiled codec step with its convolutions channels-last (+nhwc) against the default layout,
# one H200, the device image's PyTorch (no vLLM), one process each, nhwc first.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for kernels in tf32:compiled+nhwc tf32:compiled; do
  label=${kernels//[:+]/_}
  timeout ${LIMIT:-150} python3 -m bench.codec_throughput --batches 64,256 --precisions tf32 \
    --kernels "$kernels" --iters 50 --out "$OUT/$label" > "$OUT/$label.log" 2>&1; echo "rc=$?" >> "$OUT/$label.log"
  grep '^{\|rc=' "$OUT/$label.log" | cut -c1-220
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
done
