#!/bin/bash
# One served start (bench/gpu/served_start.sh): VARIANT "base" (the defaults) or "units"
# (additional_config higgs_codec fused_units: the codec's residual units of up to 128
# channels as one Triton kernel each), "unitsact" (their first activation in the kernel too),
# "unitsup" (so, and each narrow block's upsampling as one kernel), or "fp16units" /
# "fp16unitsact" / "fp16unitsup" (those with --codec-precision fp16).
# Run base and a variant in turn on one machine, LEVELS=64,128,256 (RESULTS.md sections 30
# and 31).
VARIANT=${VARIANT:-base}
units_option() {
  echo "{\"engine_args\": {\"additional_config\": {\"higgs_codec\": {\"fused_units\": $1}}}}"
}
units=$(units_option true)
unitsact=$(units_option '"activation"')
unitsup=$(units_option '"upsample"')
serve_args=""
case $VARIANT in
  base) options="" ;;
  units) options=$units ;;
  unitsact) options=$unitsact ;;
  fp16units) options=$units; serve_args="--codec-precision fp16" ;;
  unitsup) options=$unitsup ;;
  fp16unitsact) options=$unitsact; serve_args="--codec-precision fp16" ;;
  fp16unitsup) options=$unitsup; serve_args="--codec-precision fp16" ;;
  *) echo "unknown VARIANT $VARIANT (base, units, unitsact, unitsup, fp16units, fp16unitsact," \
    "fp16unitsup)" >&2; exit 2 ;;
esac
TAG=r20_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
