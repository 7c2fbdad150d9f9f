#!/bin/bash
# The codec's narrow residual units as one Triton kernel each (CausalDac's fused_units).
# PART=units: each unit alone at 256 slots, layer by layer against the fused kernel for every
# launch, with the first activation outside the kernel and inside it (bench.gpu.fused_unit_bench),
# TF32 and float16; then each narrow block's upsampling and the output layer alone, layers
# against the fused kernels (bench.gpu.fused_upsample_bench), TF32 and float16; one archive
# $OUT/units.tar.gz (~6 min).
# PART=codec: the whole codec step, with and without every narrow layer fused (fused_units
# "narrow": the units, the narrow blocks' upsampling, the output layer), TF32 and float16, at
# 2-256 slots, then the float16 step at 256 profiled with the units fused; one archive
# $OUT/codec.tar.gz (bench/gpu/codec_variants.sh; ~8 min from a cold compile cache; BATCHES=2,64,256
# and one precision's VARIANTS keep a call under 10 min). Where
# PART=units found the units alone better (or the unit kernel faster without the activation),
# pass VARIANTS with +unitsact or +units and PROFILE_ARGS="--fused-units activation" or
# "--fused-units".
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=16 CUBLAS_WORKSPACE_CONFIG=:0:0
case ${PART:-units} in
  units)
    W=$OUT/units
    mkdir -p "$W"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
    for precision in ${PRECISIONS:-tf32 fp16}; do
      timeout "${LIMIT:-200}" python3 -m bench.gpu.fused_unit_bench --batch "${BATCH:-256}" \
        --precision "$precision" --out "$W/$precision" > "$W/$precision.log" 2>&1
      echo "rc=$?" >> "$W/$precision.log"
      tail -25 "$W/$precision.log"
      timeout "${LIMIT:-200}" python3 -m bench.gpu.fused_upsample_bench --batch "${BATCH:-256}" \
        --precision "$precision" --out "$W/up_$precision" > "$W/up_$precision.log" 2>&1
      echo "rc=$?" >> "$W/up_$precision.log"
      tail -12 "$W/up_$precision.log"
    done
    tar czf "$OUT/units.tar.gz" -C "$OUT" units && rm -rf "$W"
    ;;
  codec)
    # a variant's process compiles its step from cold caches: the fused kernels'
    # builds on top of Inductor's (RESULTS.md section 34)
    NAME=codec LIMIT=${LIMIT:-300} BATCHES=${BATCHES:-2,64,128,256} NO_PROFILE=${NO_PROFILE:-} \
      PROFILE_ARGS=${PROFILE_ARGS:---fused-units narrow} \
      VARIANTS=${VARIANTS:-"tf32:compiled tf32:compiled+narrow fp16:compiled fp16:compiled+narrow"} \
      bash bench/gpu/codec_variants.sh
    ;;
  *) echo "unknown PART ${PART} (units, codec)" >&2; exit 2 ;;
esac
