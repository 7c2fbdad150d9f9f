#!/bin/bash
# One served start (bench/gpu/served_start.sh): VARIANT "base" (the defaults) or one of the
# codec options in additional_config["higgs_codec"]:
#   "units"     the residual units of up to 64 channels as one Triton kernel each;
#   "unitsact"  so, with their first activation in the kernel too;
#   "narrow"    so, and each narrow block's upsampling and the output layer as one kernel each;
#   "narrowshift"   "narrow" and products over shifted taps (gemm_taps "shifted");
#   "narrowshift4"  so, and four frames a slot in one codec call (frames_per_call 4);
# or any of those with an "fp16" prefix (with --codec-precision fp16);
#   "tf32gathered"  the defaults before RESULTS.md section 40: a TF32 codec, no fused layers,
#                   gathered taps (base is now float16, the narrow layers fused, shifted taps).
# Run base and a variant in turn on one machine, LEVELS=64,128,256 (RESULTS.md sections 30
# and 31).
VARIANT=${VARIANT:-base}
codec_option() {
  echo "{\"engine_args\": {\"additional_config\": {\"higgs_codec\": {$1}}}}"
}
serve_args=""
variant=$VARIANT
case $variant in
  fp16*) serve_args="--codec-precision fp16"; variant=${variant#fp16} ;;
esac
case $variant in
  base) options="" ;;
  tf32gathered) serve_args="--codec-precision tf32"
    options=$(codec_option '"fused_units": false, "gemm_taps": "gathered"') ;;
  units) options=$(codec_option '"fused_units": true') ;;
  unitsact) options=$(codec_option '"fused_units": "activation"') ;;
  narrow) options=$(codec_option '"fused_units": "narrow"') ;;
  narrowshift) options=$(codec_option '"fused_units": "narrow", "gemm_taps": "shifted"') ;;
  narrowshift4) options=$(codec_option \
    '"fused_units": "narrow", "gemm_taps": "shifted", "frames_per_call": 4') ;;
  *) echo "unknown VARIANT $VARIANT (base, tf32gathered, units, unitsact, narrow, narrowshift, narrowshift4;" \
    "each but base also with an fp16 prefix)" >&2; exit 2 ;;
esac
[ "$VARIANT" = fp16base ] && options=""
TAG=r20_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
