#!/usr/bin/env bash
# talker_checks.sh -- ON THE GPU MACHINE, after the vLLM kit is installed: the talker's code
# sampler eager vs replayed from its CUDA graphs, then whether the graphs change any row.
#
#   0. bench.codec_throughput     the served codec step's audio-seconds per second by batch and
#                                 precision, and its error vs a float64 decode (no vLLM)
#   1. bench.talker_sampler_step  the sampler's stages and its whole step: eager, graph, compiled graph (no vLLM)
#   2. bench.talker_vllm_check    tiny checkpoint through vLLM: graphs (vLLM's and the sampler's)
#                                 vs eager, greedy and seeded-sampled rows; greedy vs the reference
#   3. bench.talker_step          decode step time of the talker at real size (dummy weights);
#                                 STEP_MODELS=qwen3,higgs adds plain vLLM's Qwen3-4B shape beside it
#   5. bench.talker_step          (CHECKS=audio_step) the same steps with every request asking for
#                                 audio: talker + the codec beside it (the random full checkpoint)
#   4. bench.gpu.voice_prefill    (opt-in: CHECKS=voice) prefill and TTFA vs voice-reference length
#
# The sampler graphs are on in every CUDA engine (vLLM's enforce_eager turns them off), so check 2
# compares the default engine with an eager one. Results: $OUT/talker_checks.tar.gz and the JSON files.
# Environment: OUT [/tmp/h200_out]  SITE [/root/site]  WORK [/root/h200_work]  PYTHON [python3]
#   STEP_BATCHES [1,16,64,256] ("" skips check 3)  STEP_MODELS [higgs]  SAMPLER_BATCHES [1,16,64,256,384]
#   CODEC_BATCHES [1,16,64,128]  CHECKS [codec,sampler,rows,step]: which of 0-3 to run
set -u -o pipefail
OUT=${OUT:-/tmp/h200_out}
SITE=${SITE:-/root/site}
WORK=${WORK:-/root/h200_work}
PY=${PYTHON:-python3}
STEP_BATCHES=${STEP_BATCHES-1,16,64,256}
SAMPLER_BATCHES=${SAMPLER_BATCHES:-1,16,64,256,384}
CODEC_BATCHES=${CODEC_BATCHES:-1,16,64,128,256}
AUDIO_STEP_BATCHES=${AUDIO_STEP_BATCHES:-1,64,256}
STEP_MODELS=${STEP_MODELS:-higgs}
CKPT=${CKPT:-/root/higgs_v3_random}
CHECKS=${CHECKS:-codec,sampler,rows,step}
want() { [[ ",$CHECKS," == *",$1,"* ]]; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RES=$WORK/talker_checks
T0=$(date +%s)
say() { echo "[talker_checks +$(( $(date +%s) - T0 ))s] $*"; }

cd "$REPO" || exit 1
mkdir -p "$OUT" "$RES" || exit 1
KIT_PATH=$(cat "$SITE/.pythonpath") || { say "no $SITE/.pythonpath: install the vLLM kit first"; exit 1; }
export PYTHONPATH=$REPO:$KIT_PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export VLLM_USE_V2_MODEL_RUNNER=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_PLUGINS=higgs_audio_v3

if want codec; then
  say "codec decoder throughput by preset, batch and precision"
  "$PY" -m bench.codec_throughput --batches "$CODEC_BATCHES" --out "$RES" > "$RES/codec_throughput.log" 2>&1
  grep -E '"batch": (1|64|256)[,}]|peak_error|failed' "$RES/codec_throughput.log" | cut -c1-200
fi

if want sampler; then
  say "sampler step, eager vs graph"
  "$PY" -m bench.talker_sampler_step --batches "$SAMPLER_BATCHES" --iters 200 --out "$RES" \
    > "$RES/sampler_step.log" 2>&1
  tail -n 6 "$RES/sampler_step.log" | sed 's/"gpu_ms".*"whole_step"/... "whole_step"/'
fi

if want rows; then
  say "rows under graphs vs eager vs the reference (tiny checkpoint)"
  if "$PY" -m bench.talker_vllm_check --out "$RES" > "$RES/vllm_check.log" 2>&1; then
    say "graphs equal eager"
  else
    say "GRAPHS DIFFER FROM EAGER (or the check failed)"
    grep -v "^INFO\|^(EngineCore" "$RES/vllm_check.log" | tail -n 30
  fi
  [ -f "$RES/talker_vllm_check.json" ] && tr -d ' \n' < "$RES/talker_vllm_check.json" && echo
fi

if want step && [ -n "$STEP_BATCHES" ]; then
  say "talker decode step at real size"
  "$PY" -m bench.talker_step --models "$STEP_MODELS" --batches "$STEP_BATCHES" \
    --out "$RES" > "$RES/talker_step.log" 2>&1
  if [ -f "$RES/talker_step.json" ]; then cat "$RES/talker_step.json"; else tail -n 30 "$RES/talker_step.log"; fi
fi

if want audio_step; then
  say "talker + codec step at real size (audio requests, exact chunking)"
  mkdir -p "$RES/audio_step"
  "$PY" -m bench.talker_step --models higgs_audio --audio-model "$CKPT" --batches "$AUDIO_STEP_BATCHES" \
    --out "$RES/audio_step" > "$RES/audio_step.log" 2>&1
  if [ -f "$RES/audio_step/talker_step.json" ]; then cp "$RES/audio_step/talker_step.json" "$OUT/audio_step.json"; cat "$OUT/audio_step.json"
  else tail -n 40 "$RES/audio_step.log"; fi
  grep -h "codec step\|CodecCaptureError" "$RES/audio_step.log" | cut -c1-200 | head -n 3
fi

if want voice; then
  say "prefill and TTFA vs voice-reference length (0, 2, 5, 10 s), c=1"
  # shellcheck disable=SC2046  # the env file holds KEY=VALUE words
  env $(cat "$WORK/gateway.env") "$PY" -m bench.gpu.voice_prefill --out "$RES" > "$RES/voice_prefill.log" 2>&1
  if [ -f "$RES/voice_prefill.json" ]; then tr -d ' \n' < "$RES/voice_prefill.json" && echo
  else tail -n 30 "$RES/voice_prefill.log"; fi
fi

say "sampler graph messages from the engines (captured / failed):"
grep -h "code sampler" "$RES"/*.log | sed 's/.*\(captured the code sampler\|capturing the code sampler failed\)/\1/' \
  | cut -c1-200 | sort | uniq -c | head -n 5
cp "$RES"/*.json "$OUT"/ 2>/dev/null
tar -czf "$OUT/talker_checks_${CHECKS//,/_}.tar.gz" -C "$WORK" talker_checks
say "done"
