#!/usr/bin/env bash
# run_h200_x2.sh -- the gateway on two H200s of one host (device kind nvidia-h200-x2), one parallel
# layout per device call, each within one 600 s call. ON THE GPU MACHINE, from the repository root,
# after the vLLM kit is installed and PHASE=prep has run (bench/gpu/README.md, "Two GPUs").
#
#   LAYOUT=dp2 bash bench/gpu/run_h200_x2.sh   # --data-parallel-size 2: two engine cores, one GPU
#                                              # each; TTFA at c=1 (balanced), sweep up to 512
#   LAYOUT=tp2 bash bench/gpu/run_h200_x2.sh   # --tensor-parallel-size 2: one engine core over both
#                                              # GPUs; TTFA at c=1 per preset, sweep 1, 64, 128
#   LAYOUT=one bash bench/gpu/run_h200_x2.sh   # one GPU of the two (CUDA_VISIBLE_DEVICES=0), the
#                                              # baseline on the same host: presets, sweep to 384
#   DRY_RUN=1 LAYOUT=... bash bench/gpu/run_h200_x2.sh   # print the steps, run nothing
#
# Each layout is PHASE=gateway of run_h200.sh with RUN_TAG=<layout>, so its results stay in
# $WORK/results_<layout> while the machine is warm and come back as $OUT/summary_<layout>.md and
# $OUT/h200_<layout>.tar.gz. After each layout, $OUT/parallel.md compares every layout measured so
# far on this machine (python -m bench.gpu.parallel_report; run it here too on the unpacked tarballs).
#
# Environment (defaults in brackets; anything else goes through to run_h200.sh):
#   LAYOUT [dp2]  BUDGET_S [540]  LEVELS, PRESETS, CLIENT_PROCS: per layout, below
#   HTTP_LEVELS [""]: the HTTP path is not part of this comparison
set -u -o pipefail

LAYOUT=${LAYOUT:-dp2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-/root/h200_work}
OUT=${OUT:-/tmp/h200_out}
PY=${PYTHON:-python3}

case "$LAYOUT" in
  dp2)
    layout_args="--data-parallel-size 2"
    # max_num_seqs (256) is per engine core: 512 streams in all
    : "${LEVELS:=1,64,128,256,384,512}" "${PRESETS:=balanced}" "${CLIENT_PROCS:=8}" ;;
  tp2)
    layout_args="--tensor-parallel-size 2"
    : "${LEVELS:=1,64,128}" "${PRESETS:=latency,balanced,exact}" "${CLIENT_PROCS:=4}" ;;
  one)
    layout_args=""
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    : "${LEVELS:=1,64,128,256,384}" "${PRESETS:=latency,balanced,exact}" "${CLIENT_PROCS:=6}" ;;
  *) echo "LAYOUT must be dp2, tp2 or one" >&2; exit 2 ;;
esac

# Keep every all-reduce off NVLink multicast (these GPUs are shared): vLLM's symmetric-memory and
# FlashInfer all-reduces can use it; its custom all-reduce (CUDA IPC) and NCCL with NVLS off do not.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_ALLREDUCE_USE_FLASHINFER=0
export LEVELS PRESETS CLIENT_PROCS WORK OUT
export BUDGET_S=${BUDGET_S:-540} HTTP_LEVELS=${HTTP_LEVELS-}
export SERVE_ARGS="${SERVE_ARGS:-}${layout_args:+ $layout_args}"

echo "[run_h200_x2] layout $LAYOUT: serve ${SERVE_ARGS:-(one GPU)}, levels $LEVELS, presets $PRESETS"
if [ "${DRY_RUN:-0}" != 1 ] && command -v nvidia-smi > /dev/null; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  [ "$LAYOUT" = one ] || [ "$gpus" -ge 2 ] || { echo "[run_h200_x2] $LAYOUT needs 2 GPUs, found $gpus" >&2; exit 2; }
fi

PHASE=gateway RUN_TAG=$LAYOUT bash "$HERE/run_h200.sh"
rc=$?

# Compare whatever layouts this machine has measured so far.
parts=()
for l in one dp2 tp2; do [ -d "$WORK/results_$l" ] && parts+=("$l=$WORK/results_$l"); done
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "[run_h200_x2] \$ $PY -m bench.gpu.parallel_report ${parts[*]:-one=... dp2=... tp2=...} > $OUT/parallel.md"
elif [ ${#parts[@]} -gt 0 ]; then
  (cd "$REPO" && PYTHONPATH=$REPO "$PY" -m bench.gpu.parallel_report "${parts[@]}") > "$OUT/parallel.md" \
    && cat "$OUT/parallel.md"
fi
exit $rc
