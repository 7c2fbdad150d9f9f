#!/bin/bash
# The codec step alone on the GPU machine, no vLLM: each of VARIANTS (bench.codec_throughput's
# precision:kernels[+suffix...]) in a process of its own, ms a step by batch (BATCHES) and frames
# a slot a step (FRAMES, default 1) and the
# error against float64; then, unless NO_PROFILE, the float16 step at 256 slots profiled with
# PROFILE_ARGS (bench.gpu.codec_profile's flags): by kind of kernel, by convolution call, and
# Inductor's generated code. cuBLAS without a workspace, as the engine core runs (its captured
# graphs must not hold one). Everything lands in one archive, $OUT/$NAME.tar.gz (a call returns
# at most 8 files).
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 CUBLAS_WORKSPACE_CONFIG=:0:0
NAME=${NAME:?}
W=$OUT/$NAME
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
T0=$(date +%s)
for kernels in ${VARIANTS:?}; do
  label=${kernels//[:+]/_}
  timeout "${LIMIT:-150}" python3 -m bench.codec_throughput --batches "${BATCHES:-2,64,128,256}" \
    --precisions= --kernels "$kernels" --frames "${FRAMES:-1}" --iters 100 --out "$W/$label" \
    > "$W/$label.log" 2>&1
  echo "rc=$?" >> "$W/$label.log"
  grep '^{\|rc=' "$W/$label.log" | cut -c1-220
  echo "[$label done at $(( $(date +%s) - T0 )) s]"
done
if [ -z "${NO_PROFILE:-}" ]; then
  # shellcheck disable=SC2086 # PROFILE_ARGS is a list of flags
  TORCH_LOGS=output_code timeout "${LIMIT:-150}" python3 -m bench.gpu.codec_profile --batch 256 \
    --kernels compiled --precision fp16 ${PROFILE_ARGS:-} --out "$W/profile" \
    > "$W/profile.log" 2> "$W/profile_output_code.log"
  echo "rc=$?"; cat "$W/profile/codec_profile_256_kinds.txt"
  python3 -m bench.gpu.kernel_kinds "$W/profile/codec_profile_256.json.gz" \
    --calls aten::cudnn_convolution | tee "$W/profile/convolutions_by_call.txt" | cut -c1-160
  gzip -f "$W/profile_output_code.log"
fi
tar czf "$OUT/$NAME.tar.gz" -C "$OUT" "$NAME" && rm -rf "$W"
ls -la "$OUT"
