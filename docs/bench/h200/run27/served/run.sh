#!/bin/bash
# One served start (bench/gpu/served_start.sh), as section 30's: VARIANT picks the codec: "base"
# (the defaults), "fp16" (--codec-precision fp16, which now takes the products itself) or
# "fp16autotune" (that, compiled with Inductor's max-autotune-no-cudagraphs). Run base and a
# variant in turn, each start after the first on warm caches (RESULTS.md sections 28 and 30).
VARIANT=${VARIANT:-base}
AUTOTUNE='{"engine_args": {"additional_config": {"higgs_codec": {"compile_mode": "max-autotune-no-cudagraphs"}}}}'
case $VARIANT in
  base) serve_args=""; options="" ;;
  fp16) serve_args="--codec-precision fp16"; options="" ;;
  fp16autotune) serve_args="--codec-precision fp16"; options=$AUTOTUNE ;;
  *) echo "unknown VARIANT $VARIANT (base, fp16, fp16autotune)" >&2; exit 2 ;;
esac
TAG=r18_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
