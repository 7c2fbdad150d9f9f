#!/bin/bash
# The calls after the vLLM kit's ten parts (bench/gpu/README.md; the tenth also installs), on one
# machine back to back, measuring `exact`'s first chunk (docs/presets.md, "Why these values";
# RESULTS.md section 45, calls 10 and 11): the gateway's wheels and the random checkpoint
# (10); the gateway with no flag, one stream each for `latency`, `exact` and `exact` with a first
# chunk of 1 frame, then 256 streams asking for the default (`exact`, a first chunk of 4 frames),
# then for `exact`'s holdback with a first chunk of 1 frame, on the same server (11); a warm start
# with no flag, 64 and 128 streams, the same two each (12). (SWEEP_PRESETS=exact1=1:25:12:10,
# exact2=2:25:12:10 adds a first chunk of 2 frames, the least that fills a 60 ms Opus packet.)
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
case ${CALL:?CALL=10, 11 or 12} in
  10)  # the gateway's wheels, libopus and the real-size random checkpoint
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && time PHASE=prep bash bench/gpu/run_h200.sh ;;
  11)  # speech-gateway serve --model /root/higgs_v3_random --engine higgs, nothing else
    bash .whl/device_install.sh install
    TAG=r23_first SWEEP_PRESETS=${SWEEP_PRESETS:-exact1=1:25:12:10} \
      PRESETS=${PRESETS:-latency,exact,exact1=1:25:12:10} \
      BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=330 LEVELS=${LEVELS:-256} bash bench/gpu/served_start.sh ;;
  12)  # the same server flags again (warm caches), 64 and 128 streams, each chunking
    bash .whl/device_install.sh install
    TAG=r23_low SWEEP_PRESETS=${SWEEP_PRESETS:-exact1=1:25:12:10} \
      BUDGET_S=${BUDGET_S:-540} START_TIMEOUT=240 PRESETS=latency \
      LEVELS=${LEVELS:-64,128} bash bench/gpu/served_start.sh ;;
esac
