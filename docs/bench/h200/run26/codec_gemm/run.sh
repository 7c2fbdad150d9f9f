#!/bin/bash
# The codec's wide convolutions as matrix products (RESULTS.md section 28): the compiled and
# captured step in TF32 as served, then with the products from 256 channels (conv1 and the first
# two blocks) in TF32 and float16, then from 64 channels in float16; one process a variant, the
# device image's PyTorch, no vLLM. Then the float16 step with the products, profiled: by kind of
# kernel, by convolution call, and Inductor's generated code (to read the strides its fused
# kernels get: section 28's block-4 activation kernels ran at a tenth of the bandwidth).
# Each variant prints its ms per step by batch and its error against float64.
# cuBLAS without a workspace, as the engine core runs (its captured graphs must not hold one).
# Everything lands in one archive, $OUT/codec_gemm.tar.gz (a call returns at most 8 files).
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 CUBLAS_WORKSPACE_CONFIG=:0:0
W=$OUT/codec_gemm
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
T0=$(date +%s)
for kernels in ${VARIANTS:-tf32:compiled tf32:compiled+gemm fp16:compiled+gemm fp16:compiled+gemm64}; do
  label=${kernels//[:+]/_}
  timeout "${LIMIT:-150}" python3 -m bench.codec_throughput --batches "${BATCHES:-2,64,128,256}" \
    --precisions= --kernels "$kernels" --iters 100 --out "$W/$label" > "$W/$label.log" 2>&1
  echo "rc=$?" >> "$W/$label.log"
  grep '^{\|rc=' "$W/$label.log" | cut -c1-220
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
done
if [ -z "${NO_PROFILE:-}" ]; then
  TORCH_LOGS=output_code timeout "${LIMIT:-150}" python3 -m bench.gpu.codec_profile --batch 256 \
    --kernels compiled --precision fp16 --gemm-channels 256 --out "$W/profile" \
    > "$W/profile.log" 2> "$W/profile_output_code.log"
  echo "rc=$?"; cat "$W/profile/codec_profile_256_kinds.txt"
  python3 -m bench.gpu.kernel_kinds "$W/profile/codec_profile_256.json.gz" \
    --calls aten::cudnn_convolution | tee "$W/profile/convolutions_by_call.txt" | cut -c1-160
fi
tar czf "$OUT/codec_gemm.tar.gz" -C "$OUT" codec_gemm && rm -rf "$W"
ls -la "$OUT"
