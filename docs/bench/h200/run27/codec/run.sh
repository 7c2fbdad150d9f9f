#!/bin/bash
# The codec step after section 30 (RESULTS.md): float16 as served now (products from 256
# channels, their taps gathered in one copy) against section 30's 2.63 ms at 256 slots, TF32
# as this machine's baseline, and each compiled with Inductor's max-autotune-no-cudagraphs
# (templates for the products, their gathers as fused prologues); then the float16 step
# profiled (PROFILE_MODE=max-autotune-no-cudagraphs for the autotuned one). One archive,
# $OUT/codec.tar.gz.
NAME=codec LIMIT=${LIMIT:-240} PROFILE_ARGS="--compile-mode ${PROFILE_MODE:-default}" \
  VARIANTS=${VARIANTS:-"tf32:compiled fp16:compiled fp16:compiled+autotune tf32:compiled+autotune"} \
  bash bench/gpu/codec_variants.sh
