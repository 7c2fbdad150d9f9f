"""``speech-gateway serve``: pick an engine, load and warm it, serve on uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence

from pydantic import ValidationError

from gateway.logs import configure_server_logs
from gateway.protocol import Limits
from gateway.serving import build_engine, say, serve
from gateway.settings import GatewaySettings
from gateway.voice_backends import check_voice_store
from gateway.workers import DEFAULT_TALKER_HOST_WORKERS, resolve_workers, run_workers
from realtime_engine.engines.base import EngineError
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
        help="codec arithmetic on CUDA (the CPU always computes fp32): fp16 (the default: "
        "float16 weights and state, the wide convolutions as matrix products, the fastest, "
        "~2e-3 of the peak on random weights; it checks itself against float32 on the "
        "loaded weights at start-up and runs in tf32 past 1e-2), tf32 (TF32 convolutions "
        "and matrix products, ~5e-4 of the peak), fp32 (IEEE: chunked audio equals whole "
        "decoding), or bf16; docs/presets.md",
    )
    serve.add_argument(
        "--codec-kernels",
        choices=CODEC_KERNELS,
        default=DEFAULT_CODEC_KERNELS,
        help="how the codec step runs: eager PyTorch operators, snake (each activation one "
        "Triton kernel, CUDA), compiled (the whole step through torch.compile, which adds "
        "about a minute to a cold start) or auto (compiled on CUDA, eager on the CPU); one "
        f"CUDA graph per batch bucket either way (default {DEFAULT_CODEC_KERNELS})",
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
        f"connections (default {DEFAULT_TALKER_HOST_WORKERS} with the vLLM talker, which is "
        "then one engine for all of them, else 1; other engines run in every worker; "
        "docs/scaling.md, 'Worker processes')",
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
    configure_server_logs(args.log_level)
    kind = resolve_engine_kind(args.engine, args.model)
    raw = with_parallel_flags(
        args.talker_options, args.data_parallel_size, args.tensor_parallel_size
    )
    talker = engine_talker_options(kind, args.talker, raw)
    settings = settings.model_copy(update={"workers": resolve_workers(args.workers, kind, talker)})
    if settings.workers > 1:
        return run_workers(args, settings, kind, talker, say)
    say(f"loading the {kind} engine" + (f" from {args.model}" if args.model else ""))
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
    say(f"loaded in {time.perf_counter() - loading:.1f}s")
    try:
        started = asyncio.run(serve(settings, engine, args.log_level))
    except KeyboardInterrupt:
        say("stopped")
        return 0  # Ctrl-C after a graceful shutdown is a clean exit
    if not started:
        print("speech-gateway: error: the server did not start", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
