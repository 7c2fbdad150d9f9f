#!/bin/bash
# One served start (bench/gpu/served_start.sh): VARIANT picks the codec's frames a call: "base"
# (the defaults), "frames2" or "frames4" (additional_config higgs_codec frames_per_call 2 or 4:
# a slot whose next chunk is not due steps its frames that many at a time), or "fp16frames4"
# (that with --codec-precision fp16). Run base and a variant in turn on one machine (RESULTS.md
# sections 28, 30 and 31); a first start compiling three frame counts cold needs
# START_TIMEOUT=450.
VARIANT=${VARIANT:-base}
frames_option() {
  echo "{\"engine_args\": {\"additional_config\": {\"higgs_codec\": {\"frames_per_call\": $1}}}}"
}
serve_args=""
case $VARIANT in
  base) options="" ;;
  frames2) options=$(frames_option 2) ;;
  frames4) options=$(frames_option 4) ;;
  fp16frames4) options=$(frames_option 4); serve_args="--codec-precision fp16" ;;
  *) echo "unknown VARIANT $VARIANT (base, frames2, frames4, fp16frames4)" >&2; exit 2 ;;
esac
TAG=r19_${VARIANT}_${START:-1} SERVE_ARGS=$serve_args TALKER_OPTIONS=$options \
  bash bench/gpu/served_start.sh
