#!/bin/bash
# One served start (bench/gpu/served_start.sh), as section 30's: VARIANT picks the codec: "base"
# (the defaults), "fp16gemm" (float16, the convolutions of 256 channels or more as matrix
# products) or "tf32gemm" (TF32, the same products). Run base and a variant in turn, each start
# after the first on warm caches (a start that compiles anew is slower; section 28).
VARIANT=${VARIANT:-base}
GEMM='{"engine_args": {"additional_config": {"higgs_codec": {"gemm_channels": 256}}}}'
case $VARIANT in
  base) serve_args=""; options="" ;;
  fp16gemm) serve_args="--codec-precision fp16"; options=$GEMM ;;
  tf32gemm) serve_args=""; options=$GEMM ;;
  *) echo "unknown VARIANT $VARIANT (base, fp16gemm, tf32gemm)" >&2; exit 2 ;;
esac
TAG=r17_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
