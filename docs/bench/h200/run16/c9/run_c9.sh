#!/bin/bash
# call 9 tail: the codec step alone, TF32, eager against compiled (the current codec)
OUT=${OUT:?}; T0=$(date +%s)
KIT=$(cat /root/site/.pythonpath)
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0
PYTHONPATH=$PWD:$KIT timeout 200 python3 -m bench.codec_throughput --batches 1,64,128,256 --precisions tf32 --kernels "tf32:compiled" --iters 50 --out $OUT > $OUT/codec_throughput.log 2>&1
echo "codec rc=$? $(( $(date +%s)-T0 ))s"; grep -v "^\s*$" $OUT/codec_throughput.log | grep -v Warning | tail -14
