#!/bin/bash
# The codec step after section 30 (RESULTS.md): float16 as served now (products from 256
# channels, their taps gathered in one copy) against section 30's 2.63 ms at 256 slots, TF32
# as the baseline of this machine, and each compiled with Inductor's max-autotune-no-cudagraphs
# (templates for the products, their gathers as fused prologues). One process a variant, the
# device image's PyTorch, no vLLM, cuBLAS without a workspace as in the engine core. Then the
# float16 step profiled (PROFILE_MODE=max-autotune-no-cudagraphs for the autotuned one): by kind
# of kernel, by convolution call, and Inductor's generated code, gzipped.
# Everything lands in one archive, $OUT/codec.tar.gz (a call returns at most 8 files).
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 CUBLAS_WORKSPACE_CONFIG=:0:0
W=$OUT/codec
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
T0=$(date +%s)
for kernels in ${VARIANTS:-tf32:compiled fp16:compiled fp16:compiled+autotune tf32:compiled+autotune}; do
  label=${kernels//[:+]/_}
  timeout "${LIMIT:-240}" python3 -m bench.codec_throughput --batches "${BATCHES:-2,64,128,256}" \
    --precisions= --kernels "$kernels" --iters 100 --out "$W/$label" > "$W/$label.log" 2>&1
  echo "rc=$?" >> "$W/$label.log"
  grep '^{\|rc=' "$W/$label.log" | cut -c1-220
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
done
if [ -z "${NO_PROFILE:-}" ]; then
  TORCH_LOGS=output_code timeout "${LIMIT:-240}" python3 -m bench.gpu.codec_profile --batch 256 \
    --kernels compiled --precision fp16 --compile-mode "${PROFILE_MODE:-default}" \
    --out "$W/profile" > "$W/profile.log" 2> "$W/profile_output_code.log"
  echo "rc=$?"; cat "$W/profile/codec_profile_256_kinds.txt"
  python3 -m bench.gpu.kernel_kinds "$W/profile/codec_profile_256.json.gz" \
    --calls aten::cudnn_convolution | tee "$W/profile/convolutions_by_call.txt" | cut -c1-160
  gzip -f "$W/profile_output_code.log"
fi
tar czf "$OUT/codec.tar.gz" -C "$OUT" codec && rm -rf "$W"
ls -la "$OUT"
