#!/bin/bash
# call 11: the engine alone on the served mix at 256 (py-spy of its engine core), then the talker + codec step
OUT=${OUT:?}; T0=$(date +%s)
KIT=$(cat /root/site/.pythonpath)
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_DEEP_GEMM=0 VLLM_WORKER_MULTIPROC_METHOD=spawn VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
GWENV=$(cat /root/h200_work/gateway.env 2>/dev/null | tr '\n' ' ')
SPY=/root/site/_pyspy/py-spy
mkdir -p $OUT/lt
env $GWENV VLLM_USE_V2_MODEL_RUNNER=1 PYTHONPATH=$PWD:/root/h200_work/plugin:$KIT VLLM_PLUGINS=higgs_audio_v3 timeout 220 python3 -m bench.gpu.load_trace --concurrency 256 --model /root/higgs_v3_random --work /root/h200_work --out $OUT/lt --clone-share 0.36 --free-end > $OUT/load_trace.log 2>&1 &
LT=$!
for _ in $(seq 1 220); do grep -q "^measuring" $OUT/load_trace.log 2>/dev/null && break; kill -0 $LT 2>/dev/null || break; sleep 1; done
P=$(pgrep -n "^VLLM"); [ -n "$P" ] && timeout 30 $SPY record --nonblocking --format raw --rate 200 --duration 10 --threads --pid $P --output $OUT/lt/pyspy_engine.txt > /dev/null 2>&1
wait $LT; echo "load_trace rc=$? $(( $(date +%s)-T0 ))s"; grep -v "^\s*$" $OUT/load_trace.log | grep -v "INFO\|WARN" | tail -14
env $GWENV PYTHONPATH=$PWD:/root/h200_work/plugin:$KIT VLLM_PLUGINS=higgs_audio_v3 timeout $(( 570 - ($(date +%s)-T0) )) python3 -m bench.talker_step --models higgs_audio --audio-model /root/higgs_v3_random --batches 1,64,256 --out $OUT > $OUT/talker_step.log 2>&1
echo "talker_step rc=$? $(( $(date +%s)-T0 ))s"; grep -i "step_ms\|ratio\|error" $OUT/talker_step.log | tail -8
gzip -f $OUT/talker_step.log $OUT/load_trace.log; gzip -f $OUT/lt/pyspy_engine.txt 2>/dev/null; ls -la $OUT $OUT/lt
