#!/bin/bash
# RESULTS.md section 40: the calls after the vLLM kit (bench/gpu/README.md, calls 1-9), on one
# H100 machine back to back (calls 10 and 11), then on a second machine (call 12).
export GW_WHEELS=/root/gw MAKE_CKPT=/root/make_full_higgs.py
case ${CALL:?CALL=10, 11 or 12} in
  10)  # tree 80266f4: the defaults then (TF32 codec, no fused layers, gathered taps), traced at 256
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && PHASE=prep bash bench/gpu/run_h200.sh
    SERVED_TRACE=256 TRACE_S=1 VARIANT=base BUDGET_S=490 START_TIMEOUT=300 LEVELS=64,128,256 \
      bash docs/bench/h200/run29/served/run.sh ;;
  11)  # the same tree: float16, every narrow layer fused, shifted taps, one frame a call
    bash .whl/device_install.sh install
    SERVED_TRACE=256 TRACE_S=1 VARIANT=fp16narrowshift BUDGET_S=500 START_TIMEOUT=330 \
      LEVELS=64,128,256 bash docs/bench/h200/run29/served/run.sh ;;
  12)  # tree d1b2d18 (those are the defaults now), no flag, on a second machine
    mkdir -p /root/gw && cp .whl/gw/* /root/gw/ && cp .whl/peer/make_full_higgs.py /root/
    bash .whl/device_install.sh install && PHASE=prep bash bench/gpu/run_h200.sh
    VARIANT=base START=defaults BUDGET_S=420 START_TIMEOUT=300 LEVELS=64,128,256 \
      bash docs/bench/h200/run29/served/run.sh ;;
esac
