#!/bin/bash
# call 9 tail: the codec step alone with the single state tensor (TF32, eager)
OUT=${OUT:?}; T0=$(date +%s)
KIT=$(cat /root/site/.pythonpath)
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
PYTHONPATH=$PWD:$KIT timeout 120 python3 -m bench.codec_throughput --batches 1,64,128,256 --precisions tf32 --kernels "" --iters 50 --out $OUT > $OUT/codec_throughput.log 2>&1
echo "codec rc=$? $(( $(date +%s)-T0 ))s"; grep -v "^\s*$" $OUT/codec_throughput.log | tail -12
