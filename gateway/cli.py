"""``speech-gateway serve``: pick an engine, load and warm it, serve on uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections.abc import Callable, Sequence

import uvicorn
from pydantic import ValidationError

from gateway.app import create_app
from gateway.drain import ENGINE_DEAD_EXIT_STATUS, DrainingServer
from gateway.protocol import Limits
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.voice_backends import check_voice_store
from realtime_engine.engines.base import EngineError, SpeechEngine
from realtime_engine.format import (
    CODEC_KERNELS,
    CODEC_PRECISIONS,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_PRECISION,
)
from realtime_engine.talker.backends import (
    TALKER_BACKENDS,
    TalkerOptions,
    TalkerOptionsError,
    talker_options,
)

ENGINES = ("auto", "higgs", "cpu-voice", "fake")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speech-gateway", description="Realtime streaming speech gateway"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--model",
        help="Higgs Audio v3 checkpoint: a directory, a Hugging Face id (from the local cache) "
        "or 'tiny'; without it the embedded CPU voice speaks",
    )
    serve.add_argument("--engine", choices=ENGINES, default="auto")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve.add_argument(
        "--api-key",
        action="append",
        default=None,
        dest="api_keys",
        help="require this key (repeat for several); also SPEECH_GATEWAY_API_KEYS",
    )
    serve.add_argument("--device", help="torch device for the Higgs engine (cuda, cuda:1, cpu)")
    serve.add_argument(
        "--talker",
        choices=TALKER_BACKENDS,
        default="auto",
        help="Higgs talker runner: vLLM (continuous batching, CUDA), the in-process PyTorch "
        "reference, or auto (vLLM when importable with a GPU)",
    )
    serve.add_argument(
        "--talker-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="options of the chosen talker backend (realtime_engine.talker.backends), e.g. "
        '\'{"max_num_seqs": 256, "gpu_memory_utilization": 0.8}\' for vllm (default '
        "max_num_seqs 256) or '{\"max_batch\": 8}' for reference; an unknown key is an error",
    )
    for flag, what in (
        ("--data-parallel-size", "vLLM engine cores, one GPU each, requests balanced across them"),
        ("--tensor-parallel-size", "GPUs that split each vLLM engine core's model"),
    ):
        serve.add_argument(
            flag,
            type=int,
            default=None,
            metavar="N",
            help=f"--talker vllm: {what} (the talker option of the same name; docs/scaling.md)",
        )
    serve.add_argument(
        "--codec-precision",
        choices=CODEC_PRECISIONS,
        default=DEFAULT_CODEC_PRECISION,
        help="codec arithmetic on CUDA (the CPU always computes fp32): tf32 (the default, "
        "~1e-3 of the peak), fp32 (IEEE) or bf16",
    )
    serve.add_argument(
        "--codec-kernels",
        choices=CODEC_KERNELS,
        default=DEFAULT_CODEC_KERNELS,
        help="how the codec step runs on CUDA: eager PyTorch operators, snake (each activation "
        "one Triton kernel) or compiled (the whole step through torch.compile); one CUDA "
        f"graph per batch bucket either way (default {DEFAULT_CODEC_KERNELS})",
    )
    serve.add_argument(
        "--codec-batch",
        type=int,
        default=64,
        help="most chunks cut per codec call (the codec runs beside the talker)",
    )
    serve.add_argument(
        "--model-name",
        help="the model name sessions, /ready and /v1/models report (default: the engine's id)",
    )
    serve.add_argument("--max-sessions", type=int, help="concurrent WebSocket sessions")
    serve.add_argument("--max-contexts", type=int, help="open contexts per session")
    serve.add_argument("--idle-timeout", type=float, help="seconds before an idle session closes")
    serve.add_argument(
        "--voice-dir",
        help="directory where encoded voices persist across restarts (default: memory only)",
    )
    serve.add_argument(
        "--voice-store",
        metavar="URL",
        help="a voice store shared by several gateway replicas, e.g. redis://host:6379/0 "
        "(needs the [redis] extra; docs/scaling.md); excludes --voice-dir",
    )
    serve.add_argument(
        "--voice-cache", type=int, help="encoded voices kept in memory (least recently used out)"
    )
    serve.add_argument(
        "--encode-threads",
        type=int,
        help="threads encoding every session's long chunks, the listener closest to running "
        "dry first (default 4: Opus runs in C; more threads mostly contend with the event "
        "loop for the GIL)",
    )
    serve.add_argument(
        "--read-ahead",
        type=float,
        metavar="SECONDS",
        help="read each context's audio from the talker up to SECONDS ahead of what was "
        "sent, so its next segment starts sooner (default 0: in step with the sending; "
        "audio read ahead of a listener who stops is wasted, docs/bench/RESULTS.md s. 17)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="gateway processes accepting on the one listening socket, each owning its "
        "connections (default 1); a vLLM talker is one engine for all of them, other "
        "engines run in every worker (docs/scaling.md, 'Worker processes')",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds open contexts may finish before they are cancelled "
        "(a second signal exits at once)",
    )
    serve.add_argument(
        "--exit-on-engine-death",
        action="store_true",
        help="exit with status 3 when the engine dies while serving (default: stay up, "
        "/ready 503, so a supervisor probing /ready restarts it)",
    )
    serve.add_argument(
        "--fake-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="--engine fake only: timing and faults, e.g. "
        '\'{"realtime_factor": 1.0, "fail_after_segments": 10, "hang_after_segments": 20, '
        '"die_after_segments": 30}\' (docs/reliability.md)',
    )
    serve.add_argument("--log-level", default="info")
    return parser


def _json_object(value: str) -> dict[str, object]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return parsed


def resolve_engine_kind(engine: str, model: str | None) -> str:
    if engine == "auto":
        return "higgs" if model else "cpu-voice"
    if engine == "higgs" and not model:
        raise SystemExit("--engine higgs needs --model (a checkpoint directory, HF id or 'tiny')")
    return engine


def with_parallel_flags(
    raw: dict[str, object] | None, data_parallel: int | None, tensor_parallel: int | None
) -> dict[str, object] | None:
    """``--talker-options`` with ``--data/tensor-parallel-size`` added (they must agree)."""
    flags = {"data_parallel_size": data_parallel, "tensor_parallel_size": tensor_parallel}
    given = {key: value for key, value in flags.items() if value is not None}
    if not given:
        return raw
    merged = dict(raw or {})
    for key, value in given.items():
        if key in merged and merged[key] != value:
            flag = "--" + key.replace("_", "-")
            raise SystemExit(
                f"speech-gateway: error: {flag} {value} contradicts --talker-options "
                f"{key}={merged[key]!r}"
            )
        merged[key] = value
    return merged


def engine_talker_options(
    kind: str, talker: str, raw: dict[str, object] | None
) -> TalkerOptions | None:
    """The Higgs engine's typed talker options, resolved once; ``SystemExit`` on bad ones."""
    if kind != "higgs":
        if raw:
            raise SystemExit(f"--talker-options apply to --engine higgs only, not {kind}")
        return None
    try:
        return talker_options(talker, raw)
    except TalkerOptionsError as e:
        raise SystemExit(f"speech-gateway: error: {e}") from e


def build_engine(
    kind: str,
    model: str | None,
    device: str | None,
    talker: TalkerOptions | None = None,
    codec_precision: str = DEFAULT_CODEC_PRECISION,
    codec_batch: int = 64,
    codec_kernels: str = DEFAULT_CODEC_KERNELS,
    fake_options: dict[str, object] | None = None,
    talker_host: str | None = None,
) -> SpeechEngine:
    """``talker_host``: the vLLM talker's engine is served by that endpoint
    (``serve --workers``) instead of started here."""
    if kind == "fake":
        from realtime_engine.engines.fake import FakeEngine

        try:
            return FakeEngine(None, **(fake_options or {}))
        except TypeError as e:
            raise EngineError(f"--fake-options: {e}") from e
    if fake_options:
        raise EngineError("--fake-options applies to --engine fake only")
    if kind == "cpu-voice":
        from realtime_engine.engines.cpu_voice import CpuVoiceEngine

        return CpuVoiceEngine()
    from realtime_engine.engines.higgs import HiggsEngine

    engine: SpeechEngine = HiggsEngine.from_pretrained(
        model or "tiny",
        device,
        talker=talker,
        codec_precision=codec_precision,
        codec_batch=codec_batch,
        codec_kernels=codec_kernels,
        talker_host=talker_host,
    )
    return engine


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    limits = Limits()
    if args.max_sessions is not None:
        limits.max_sessions = args.max_sessions
    if args.max_contexts is not None:
        limits.max_contexts = args.max_contexts
    if args.idle_timeout is not None:
        limits.idle_timeout_s = args.idle_timeout
    return GatewaySettings.from_env(
        warm_in_background=True,  # /health answers while a large model warms up
        freeze_gc_heap=True,  # no full-heap collection pauses while serving
        host=args.host,
        port=args.port,
        api_keys=tuple(args.api_keys) if args.api_keys else None,
        limits=limits,
        voice_dir=getattr(args, "voice_dir", None),
        voice_store=getattr(args, "voice_store", None),
        voice_cache_entries=getattr(args, "voice_cache", None),
        encode_threads=getattr(args, "encode_threads", None),
        read_ahead_s=getattr(args, "read_ahead", None),
        workers=getattr(args, "workers", None),
        drain_timeout_s=args.drain_timeout,
        exit_on_engine_death=args.exit_on_engine_death or None,
        model_name=args.model_name,
    )


def _say(message: str) -> None:
    print(f"speech-gateway: {message}", flush=True)


def build_server(
    settings: GatewaySettings, engine: SpeechEngine, log_level: str = "info"
) -> tuple[DrainingServer, GatewayState]:
    """The server for ``settings.host``/``port`` (or for the sockets given to its ``serve``)."""
    app = create_app(settings, engine)
    state: GatewayState = app.state.gateway
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_level=log_level,
        # Messages up to twice the limit reach the session (an error, then 1009
        # on the second); beyond that the transport closes with 1009 at once.
        ws_max_size=2 * settings.limits.max_message_bytes,
        # Opus and PCM do not compress: per-message deflate only costs CPU
        # and latency on every frame.
        ws_per_message_deflate=False,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
    )
    server = DrainingServer(config, state, settings.drain_timeout_s, settings.exit_on_engine_death)
    return server, state


async def serve(
    settings: GatewaySettings,
    engine: SpeechEngine,
    log_level: str = "info",
    say: Callable[[str], None] = _say,
    *,
    sockets: list[socket.socket] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> bool:
    """Serve until interrupted; False when the server never started (engine failed).

    ``sockets``: serve on these bound sockets (a worker: the shared one first)
    instead of binding ``settings.host``/``port``. ``on_ready`` is called once
    the engine is warm; a worker's supervisor announces the address then.
    """
    server, state = build_server(settings, engine, log_level)
    task = asyncio.create_task(server.serve(sockets))
    started = time.perf_counter()
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if not server.started:
        await task
        return False
    port = server.servers[0].sockets[0].getsockname()[1]
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    say(f"listening on {host}:{port}; warming up the {engine.name} engine ({engine.model_id})")
    while not state.ready and state.engine_error is None and not task.done():
        await asyncio.sleep(0.05)
    if state.engine_error is not None:
        say(f"error: the engine failed to start: {state.engine_error}")
        server.should_exit = True
        await task
        return False
    if state.ready:
        say(f"ready in {time.perf_counter() - started:.1f}s")
        if on_ready is not None:
            on_ready()
        else:
            say(f"open http://{host}:{port}/  (WebSocket ws://{host}:{port}/v1/realtime)")
    await task
    if server.engine_died:
        say(f"error: the engine died: {state.engine_error}")
        raise SystemExit(ENGINE_DEAD_EXIT_STATUS)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = settings_from_args(args)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in e.errors()
        )
        print(f"speech-gateway: error: invalid settings: {problems}", file=sys.stderr)
        return 2
    try:
        check_voice_store(settings.voice_store, settings.voice_dir)
    except ValueError as e:
        print(f"speech-gateway: error: {e}", file=sys.stderr)
        return 2
    kind = resolve_engine_kind(args.engine, args.model)
    raw = with_parallel_flags(
        args.talker_options, args.data_parallel_size, args.tensor_parallel_size
    )
    talker = engine_talker_options(kind, args.talker, raw)
    if settings.workers > 1:
        from gateway.workers import run_workers

        return run_workers(args, settings, kind, talker, _say)
    _say(f"loading the {kind} engine" + (f" from {args.model}" if args.model else ""))
    loading = time.perf_counter()
    try:
        engine = build_engine(
            kind,
            args.model,
            args.device,
            talker,
            args.codec_precision,
            args.codec_batch,
            args.codec_kernels,
            args.fake_options,
        )
    except EngineError as e:
        print(f"speech-gateway: error: {e}", file=sys.stderr)
        return 2
    _say(f"loaded in {time.perf_counter() - loading:.1f}s")
    try:
        started = asyncio.run(serve(settings, engine, args.log_level))
    except KeyboardInterrupt:
        _say("stopped")
        return 0  # Ctrl-C after a graceful shutdown is a clean exit
    if not started:
        print("speech-gateway: error: the server did not start", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
