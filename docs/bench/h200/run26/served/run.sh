#!/bin/bash
# One served start (after the vLLM kit and PHASE=prep, bench/gpu/README.md calls 1-10): the
# presets at one stream, then 64, 128 and 256 streams, as section 28's R16b. VARIANT picks the
# codec: "base" (the defaults), "fp16gemm" (float16, the convolutions of 256 channels or more
# as matrix products) or "tf32gemm" (TF32, the same products). Run base and a variant in turn,
# each start after the first on warm caches (a start that compiles anew is slower; section 28).
OUT=${OUT:?}
VARIANT=${VARIANT:-base}
GEMM='{"engine_args": {"additional_config": {"higgs_codec": {"gemm_channels": 256}}}}'
case $VARIANT in
  base) serve_args=""; options="" ;;
  fp16gemm) serve_args="--codec-precision fp16"; options=$GEMM ;;
  tf32gemm) serve_args=""; options=$GEMM ;;
  *) echo "unknown VARIANT $VARIANT (base, fp16gemm, tf32gemm)" >&2; exit 2 ;;
esac
tag=r17_${VARIANT}_${START:-1}
RUN_TAG=$tag SERVE_ARGS="$serve_args" TALKER_OPTIONS="$options" BUDGET_S=${BUDGET_S:-450} \
  START_TIMEOUT=${START_TIMEOUT:-300} PHASE=gateway PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} \
  HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > "$OUT/run_$tag.log" 2>&1
echo "rc=$?"; grep -v "^\s*$" "$OUT/run_$tag.log" | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|ready in" "/root/h200_work/results_$tag/server_"*.log \
  2>/dev/null | cut -c1-200 | head
rm -f "$OUT"/*.png; gzip -f "$OUT/run_$tag.log"; ls -la "$OUT"
