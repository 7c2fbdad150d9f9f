#!/bin/bash
# One served start (bench/gpu/served_start.sh): VARIANT "base" (the defaults) or "units"
# (additional_config higgs_codec fused_units: the codec's residual units of up to 64
# channels as one Triton kernel each), "unitsact" (their first activation in the kernel too),
# "narrow" (so, and each narrow block's upsampling and the output layer as one kernel each),
# or "fp16units" /
# "fp16unitsact" / "fp16narrow" (those with --codec-precision fp16).
# Run base and a variant in turn on one machine, LEVELS=64,128,256 (RESULTS.md sections 30
# and 31).
VARIANT=${VARIANT:-base}
units_option() {
  echo "{\"engine_args\": {\"additional_config\": {\"higgs_codec\": {\"fused_units\": $1}}}}"
}
units=$(units_option true)
unitsact=$(units_option '"activation"')
narrow=$(units_option '"narrow"')
serve_args=""
case $VARIANT in
  base) options="" ;;
  units) options=$units ;;
  unitsact) options=$unitsact ;;
  fp16units) options=$units; serve_args="--codec-precision fp16" ;;
  narrow) options=$narrow ;;
  fp16unitsact) options=$unitsact; serve_args="--codec-precision fp16" ;;
  fp16narrow) options=$narrow; serve_args="--codec-precision fp16" ;;
  *) echo "unknown VARIANT $VARIANT (base, units, unitsact, narrow, fp16units, fp16unitsact," \
    "fp16narrow)" >&2; exit 2 ;;
esac
TAG=r20_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
