#!/bin/bash
# The calls after the vLLM kit's ten parts (bench/gpu/README.md; the tenth also installs),
# on one machine back to back (RESULTS.md section 43): the gateway's wheels and the random
# checkpoint (10); the gateway with no flag (11; at tree 824337b, where that meant playback
# pacing at a decode batch of 160: now CAP=160 CALL=13); pacing off, now the default (12);
# paced at CAP (13); on a second machine, 256 streams paced at 192, then unpaced (14).
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
unpaced='{"engine_args": {"additional_config": {"higgs_pacing": {"max_decode_batch": 0}}}}'
case ${CALL:?CALL=10, 11, 12, 13 or 14} in
  10)  # the gateway's wheels, libopus and the real-size random checkpoint
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && time PHASE=prep bash bench/gpu/run_h200.sh ;;
  11)  # speech-gateway serve --model /root/higgs_v3_random --engine higgs, nothing else
    bash .whl/device_install.sh install
    VARIANT=base START=paced BUDGET_S=${BUDGET_S:-540} START_TIMEOUT=330 \
      LEVELS=${LEVELS:-64,128,256} bash docs/bench/h200/run29/served/run.sh ;;
  12)  # the same, pacing off
    bash .whl/device_install.sh install
    TAG=r21_unpaced SERVE_ARGS="" TALKER_OPTIONS=$unpaced \
      BUDGET_S=${BUDGET_S:-380} START_TIMEOUT=300 LEVELS=${LEVELS:-256} \
      bash bench/gpu/served_start.sh ;;
  13)  # paced at another cap (CAP)
    bash .whl/device_install.sh install
    TAG=r21_cap${CAP:?} SERVE_ARGS="" \
      TALKER_OPTIONS="{\"engine_args\": {\"additional_config\": {\"higgs_pacing\": {\"max_decode_batch\": $CAP}}}}" \
      BUDGET_S=${BUDGET_S:-380} START_TIMEOUT=300 LEVELS=${LEVELS:-256} \
      bash bench/gpu/served_start.sh ;;
  14)  # on a second machine, 256 streams only: paced at CAP (192), then unpaced
    bash .whl/device_install.sh install
    CAP=${CAP:-192} PRESETS=latency START_TIMEOUT=330 BUDGET_S=330 CALL=13 bash "$0"
    PRESETS=latency BUDGET_S=230 CALL=12 bash "$0" ;;
esac
