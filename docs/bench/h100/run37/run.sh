#!/bin/bash
# The calls after the vLLM kit's nine parts (bench/gpu/README.md; the ninth also installs),
# on one machine back to back: the gateway's wheels and the random checkpoint, the defaults
# served with no flag, then the talker's decode step beside plain vLLM's on the same machine.
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
case ${CALL:?CALL=10, 11, 12 or 13} in
  10)  # the gateway's wheels, libopus and the real-size random checkpoint
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && time PHASE=prep bash bench/gpu/run_h200.sh ;;
  11)  # speech-gateway serve --model /root/higgs_v3_random --engine higgs, nothing else
    bash .whl/device_install.sh install
    VARIANT=base START=defaults BUDGET_S=${BUDGET_S:-530} START_TIMEOUT=330 \
      LEVELS=${LEVELS:-64,128,256} bash docs/bench/h200/run29/served/run.sh ;;
  12)  # decode step: plain vLLM (Qwen3-4B shape), the talker, the talker with the codec beside it
    bash .whl/device_install.sh install
    CHECKS=step,audio_step STEP_MODELS=qwen3,higgs STEP_BATCHES=1,16,64,256 \
      AUDIO_STEP_BATCHES=1,64,256 bash bench/gpu/talker_checks.sh ;;
  13)  # --codec-precision tf32, no fused layers, gathered taps (the defaults before section 40)
    bash .whl/device_install.sh install
    VARIANT=tf32gathered BUDGET_S=${BUDGET_S:-500} START_TIMEOUT=300 \
      LEVELS=${LEVELS:-64,128,256} bash docs/bench/h200/run29/served/run.sh ;;
esac
