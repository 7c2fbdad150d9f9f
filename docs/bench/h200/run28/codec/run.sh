#!/bin/bash
# The codec step with several frames a slot a call (SlotCodec's frames_per_call): TF32 as served,
# compiled, at 2-256 slots and 1, 2 and 4 frames a slot, each frame count a captured graph per
# bucket. Serving B slots four frames a call every fourth step costs the step of B/4 slots at 4
# frames against the step of B slots at 1. No profile by default (section 30 has the one-frame
# step's). One archive, $OUT/codec.tar.gz.
NAME=codec LIMIT=${LIMIT:-540} FRAMES=${FRAMES:-1,2,4} BATCHES=${BATCHES:-2,16,32,64,128,256} \
  NO_PROFILE=${NO_PROFILE-1} VARIANTS=${VARIANTS:-"tf32:compiled"} bash bench/gpu/codec_variants.sh
