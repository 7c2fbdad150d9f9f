#!/bin/bash
# The codec's wide convolutions as matrix products (RESULTS.md sections 28 and 30): the compiled
# and captured step in TF32 as served, then with the products from 256 channels (conv1 and the
# first two blocks) in TF32 and float16, then from 64 channels in float16 (section 30 ran the
# first three); then the float16 step with the products, profiled, with Inductor's generated
# code (to read the strides its fused kernels get). One archive, $OUT/codec_gemm.tar.gz.
NAME=codec_gemm PROFILE_ARGS="--gemm-channels 256" \
  VARIANTS=${VARIANTS:-"tf32:compiled tf32:compiled+gemm fp16:compiled+gemm fp16:compiled+gemm64"} \
  bash bench/gpu/codec_variants.sh
