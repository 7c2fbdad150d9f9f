#!/bin/bash
# the same served levels on three trees, one machine: J (bfdf0e0), the folded Snake (b20fd7c), HEAD
ROOT=$PWD; T0=$(date +%s)
RUN_TAG=prep PHASE=prep BUDGET_S=120 bash bench/gpu/run_h200.sh > /tmp/prep.log 2>&1; echo "prep rc=$? $(( $(date +%s)-T0 ))s"
for t in bfdf0e0 b20fd7c head; do
  dir=.whl/tree_$t; [ $t = head ] && dir=.
  (cd $dir && RUN_TAG=ab_$t BUDGET_S=172 PHASE=gateway PRESETS=, LEVELS=64,256 HTTP_LEVELS= SWEEP_WARMUP=5 SWEEP_DURATION=10 PROFILE_LEVELS= OUT=/tmp/h200_out GW_WHEELS=$ROOT/.whl/gw MAKE_CKPT=$ROOT/.whl/peer/make_full_higgs.py bash bench/gpu/run_h200.sh > /tmp/ab_$t.log 2>&1)
  echo "$t rc=$? $(( $(date +%s)-T0 ))s"; grep "| closed \|^start\|start_vllm" /tmp/ab_$t.log | grep -v "queue p50" | head -8
done
rm -f /tmp/h200_out/*.png; ls /tmp/h200_out
