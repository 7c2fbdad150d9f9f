#!/bin/bash
# The calls after the vLLM kit's ten parts (bench/gpu/README.md; the tenth also installs),
# on one machine back to back (RESULTS.md section 44): the gateway's wheels and the random
# checkpoint (10); the gateway with no flag, one stream and 64, 128 and 256 streams (11); then
# 256 streams paced at each cap of CAPS (12, "192 224"); on a fresh machine after the kit and call
# 10, the defaults at 256 streams with each latency preset's sessions (13).
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
case ${CALL:?CALL=10, 11, 12 or 13} in
  10)  # the gateway's wheels, libopus and the real-size random checkpoint
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && time PHASE=prep bash bench/gpu/run_h200.sh ;;
  11)  # speech-gateway serve --model /root/higgs_v3_random --engine higgs, nothing else
    bash .whl/device_install.sh install
    TAG=r22_defaults SERVE_ARGS="" TALKER_OPTIONS="" BUDGET_S=${BUDGET_S:-520} \
      START_TIMEOUT=330 LEVELS=${LEVELS:-64,128,256} bash bench/gpu/served_start.sh ;;
  12)  # the same with playback pacing at each cap, 256 streams
    bash .whl/device_install.sh install
    for cap in ${CAPS:-192 224}; do
      TAG=r22_cap$cap SERVE_ARGS="" PRESETS=latency LEVELS=${LEVELS:-256} \
        TALKER_OPTIONS="{\"engine_args\": {\"additional_config\": {\"higgs_pacing\": {\"max_decode_batch\": $cap}}}}" \
        BUDGET_S=${BUDGET_S:-250} START_TIMEOUT=240 bash bench/gpu/served_start.sh
    done ;;
  13)  # no flag; 256 streams asking for exact (the default), then latency, then balanced
    bash .whl/device_install.sh install
    TAG=r22_presets SERVE_ARGS="" TALKER_OPTIONS="" SWEEP_PRESETS=latency,balanced \
      BUDGET_S=${BUDGET_S:-530} START_TIMEOUT=330 LEVELS=${LEVELS:-256} bash bench/gpu/served_start.sh ;;
esac
