#!/bin/bash
# The compiled codec step in TF32, in float16, and in TF32 with channels-last convolutions, one
# H200, the device image's PyTorch (no vLLM), one process each, no eager baselines
# (--precisions=). Each prints its ms per step by batch and its error against float64.
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
for kernels in ${VARIANTS:-fp16:compiled tf32:compiled tf32:compiled+nhwc}; do
  label=${kernels//[:+]/_}
  timeout ${LIMIT:-180} python3 -m bench.codec_throughput --batches ${BATCHES:-2,64,128,256} \
    --precisions= --kernels "$kernels" --iters 100 ${EXTRA:-} --out "$OUT/$label" > "$OUT/$label.log" 2>&1
  echo "rc=$?" >> "$OUT/$label.log"
  grep '^{\|rc=' "$OUT/$label.log" | cut -c1-220
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
done
