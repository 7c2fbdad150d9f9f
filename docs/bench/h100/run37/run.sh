#!/bin/bash
# The calls after the vLLM kit's ten parts (bench/gpu/README.md; the tenth also installs),
# on one machine back to back, in the order they ran (RESULTS.md section 42): the gateway's
# wheels and the random checkpoint; the decode step of plain vLLM, the talker and the talker
# with the codec beside it; the defaults served with no flag; the same with an FP8 KV cache.
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
case ${CALL:?CALL=10, 11, 12 or 13} in
  10)  # the gateway's wheels, libopus and the real-size random checkpoint
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && time PHASE=prep bash bench/gpu/run_h200.sh ;;
  11)  # decode step: plain vLLM (Qwen3-4B shape), the talker, the talker with the codec beside it
    bash .whl/device_install.sh install
    CHECKS=step,audio_step STEP_MODELS=qwen3,higgs STEP_BATCHES=1,16,64,256 \
      AUDIO_STEP_BATCHES=1,64,256 bash bench/gpu/talker_checks.sh ;;
  12)  # speech-gateway serve --model /root/higgs_v3_random --engine higgs, nothing else
    bash .whl/device_install.sh install
    VARIANT=base START=defaults BUDGET_S=${BUDGET_S:-440} START_TIMEOUT=330 \
      LEVELS=${LEVELS:-128,256} bash docs/bench/h200/run29/served/run.sh ;;
  13)  # the same with vLLM's FP8 KV cache
    bash .whl/device_install.sh install
    TAG=r20_fp8kv SERVE_ARGS="" TALKER_OPTIONS='{"engine_args": {"kv_cache_dtype": "fp8"}}' \
      BUDGET_S=${BUDGET_S:-380} START_TIMEOUT=300 LEVELS=${LEVELS:-128,256} \
      bash bench/gpu/served_start.sh ;;
esac
