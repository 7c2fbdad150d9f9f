"""``python -m bench``: load runs, smoke runs, overhead runs.

python -m bench run --url http://HOST:8000 --levels 1,4,16,64 --duration 30
python -m bench run --url http://HOST:8000 --peer-url http://HOST:8095 --levels 1,16,64
python -m bench run --url http://HOST:8000 --mode open --levels 0.5,1,2
python -m bench run --url http://HOST:8000 --audio-seconds 10 --levels 1,64,256
python -m bench run --peer-url http://HOST:8095 --audio-seconds 10 --levels 1,16,64
python -m bench smoke --out bench-out/        (also: python -m bench --smoke ...)
python -m bench overhead --sessions 500 --out bench-out/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench import plots
from bench.report import stage_table
from bench.sweep import SweepConfig, new_result, sweep, table
from bench.targets import GatewayTarget, SpeechHttpTarget, steps_for_audio
from bench.textfeed import TEXTS
from realtime_engine.format import SAMPLE_RATE


def _levels(spec: str) -> list[float]:
    try:
        levels = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"levels must be numbers, got {spec!r}") from e
    if not levels or any(v <= 0 for v in levels):
        raise argparse.ArgumentTypeError(f"levels must be positive, got {spec!r}")
    return levels


def _seconds(value: str) -> float:
    seconds = float(value)
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"seconds must be in (0, 3600], got {value!r}")
    return seconds


def _rate(value: str) -> float | None:
    rate = float(value)
    return None if rate <= 0 else rate


def _output(p: argparse.ArgumentParser) -> None:
    """Flags every subcommand has: where results go, the window, the audio format."""
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds excluded at the start")
    p.add_argument("--duration", type=float, default=30.0, help="measurement window (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", default="opus", choices=("opus", "pcm16", "pcm_f32", "mulaw"))
    p.add_argument("--sample-rate", type=int, default=SAMPLE_RATE)
    p.add_argument("--no-decode", action="store_true", help="do not decode audio on the client")
    p.add_argument("--no-progress", action="store_true")


def _load(p: argparse.ArgumentParser) -> None:
    """Flags of the load sweeps (run, smoke)."""
    p.add_argument(
        "--mode",
        choices=("closed", "open"),
        default="closed",
        help="closed: levels are concurrencies; open: Poisson arrivals per second",
    )
    p.add_argument(
        "--tokens-per-s",
        type=_rate,
        default=30.0,
        help="text streamed token by token at this rate; 0 sends it all at once",
    )
    p.add_argument(
        "--prebuffer-ms",
        type=float,
        default=0.0,
        help="player jitter buffer before playback starts",
    )
    p.add_argument(
        "--underrun-ms",
        type=float,
        default=100.0,
        help="a playback stall longer than this is an underrun",
    )
    p.add_argument(
        "--text",
        action="append",
        default=None,
        help="text to speak (repeatable); default: the built-in sentences",
    )
    p.add_argument(
        "--audio-seconds",
        type=_seconds,
        default=None,
        help="fixed audio length per stream (random weights never stop): the session's "
        "max_audio_seconds caps each segment at this, the stream is cancelled once this much "
        "audio has arrived; HTTP requests get max_new_tokens for it unless --max-new-tokens",
    )
    p.add_argument(
        "--no-cut",
        action="store_true",
        help="with --audio-seconds: let each stream end on its own (every segment still "
        "capped at it) instead of cancelling it once that much audio has arrived, so no "
        "audio generated past the cut goes unheard",
    )
    p.add_argument(
        "--session",
        type=json.loads,
        default={},
        help='extra session.update fields as JSON, e.g. \'{"latency_preset": "latency"}\'',
    )
    p.add_argument(
        "--raw", action="store_true", help="keep every stream's timestamps and chunks in the JSON"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="benchmark a running gateway (and optionally the peer)")
    run.add_argument(
        "--url", default=None, help="gateway base URL (http:// or ws://); optional with --peer-url"
    )
    run.add_argument("--api-key", default=None)
    run.add_argument("--voice", default=None)
    run.add_argument("--levels", type=_levels, default=[1.0, 4.0, 16.0])
    run.add_argument(
        "--peer-url",
        default=None,
        help="also run the same levels against a streaming /v1/audio/speech server",
    )
    run.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="talker steps per HTTP request (the peer, and the gateway with --http): "
        "a fixed audio length with random weights, e.g. 250 -> 9.68 s",
    )
    run.add_argument(
        "--http",
        action="store_true",
        help="drive the gateway's own /v1/audio/speech instead of the WebSocket",
    )
    _output(run)
    _load(run)

    smoke = sub.add_parser("smoke", help="in-process gateway with the fake engine, a few seconds")
    smoke.add_argument("--levels", type=_levels, default=[1.0, 4.0])
    smoke.add_argument(
        "--engine-rtf", type=float, default=0.1, help="fake engine wall seconds per audio second"
    )
    smoke.add_argument("--first-chunk-delay-ms", type=float, default=50.0)
    _output(smoke)
    _load(smoke)
    smoke.set_defaults(warmup=0.5, duration=2.0)

    over = sub.add_parser("overhead", help="fake engine, many sessions: what the gateway adds")
    over.add_argument("--sessions", type=int, default=500)
    over.add_argument("--engine-rtf", type=float, default=1.0)
    over.add_argument("--first-chunk-delay-ms", type=float, default=50.0)
    over.add_argument("--ramp", type=float, default=5.0, help="seconds to open all sessions")
    over.add_argument("--words", type=int, default=18, help="words per context (18: ~5 s of audio)")
    over.add_argument("--frame-ms", type=int, default=20, help="output frame length")
    _output(over)
    over.set_defaults(warmup=8.0, duration=20.0, format="pcm16")
    return parser


def _sweep_config(args: argparse.Namespace) -> SweepConfig:
    return SweepConfig(
        mode=args.mode,
        levels=args.levels,
        warmup_s=args.warmup,
        duration_s=args.duration,
        seed=args.seed,
        tokens_per_s=args.tokens_per_s,
        prebuffer_s=args.prebuffer_ms / 1000,
        underrun_threshold_s=args.underrun_ms / 1000,
        texts=tuple(args.text) if args.text else TEXTS,
        raw=args.raw,
    )


def _gateway_target(args: argparse.Namespace, url: str) -> GatewayTarget:
    return GatewayTarget(
        url=url,
        api_key=getattr(args, "api_key", None),
        tokens_per_s=args.tokens_per_s,
        output_format=args.format,
        sample_rate=args.sample_rate,
        voice=getattr(args, "voice", None),
        session=args.session,
        decode=not args.no_decode,
        audio_seconds=args.audio_seconds,
        cut_at_cap=not args.no_cut,
    )


def _http_steps(args: argparse.Namespace) -> int | None:
    """Talker steps per HTTP request: --max-new-tokens, else from --audio-seconds."""
    if args.max_new_tokens is not None:
        return int(args.max_new_tokens)
    return None if args.audio_seconds is None else steps_for_audio(args.audio_seconds)


def write_outputs(result: dict[str, Any], out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=1))
    result_paths = plots.write_all(result, out, prefix=f"{name}_")
    print(table(result["levels"]), file=sys.stderr)
    stages = stage_table(result["levels"])
    if stages:
        print(stages, file=sys.stderr)
    print(f"[bench] wrote {path} and {len(result_paths)} plots", file=sys.stderr)
    return path


async def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.url is None and args.peer_url is None:
        print("bench run: give --url (the gateway), --peer-url, or both", file=sys.stderr)
        return 2
    if args.http and args.url is None:
        print("bench run: --http needs --url", file=sys.stderr)
        return 2
    cfg = _sweep_config(args)
    steps = _http_steps(args)
    result = new_result(
        "run",
        cfg,
        {
            "url": args.url,
            "peer_url": args.peer_url,
            "format": args.format,
            "http": args.http,
            "max_new_tokens": steps,
            "audio_seconds": args.audio_seconds,
            "cut_at_cap": not args.no_cut,
        },
        argv,
    )
    targets: list[tuple[str, Any]] = []
    if args.url is not None and args.http:
        targets.append(
            (
                "gateway-http",
                SpeechHttpTarget(
                    args.url,
                    api_key=args.api_key,
                    max_new_tokens=steps,
                    label="gateway-http",
                ),
            )
        )
    elif args.url is not None:
        targets.append(("gateway", _gateway_target(args, args.url)))
    if args.peer_url:
        targets.append(("peer", SpeechHttpTarget(args.peer_url, max_new_tokens=steps)))
    for label, target in targets:
        levels, rows = await sweep(target, cfg, label, progress=not args.no_progress)
        result["levels"].extend(levels)
        result["streams"].extend(rows)
        if isinstance(target, SpeechHttpTarget):
            await target.aclose()
    write_outputs(result, args.out, "run")
    return 0 if all(lv["ok"] > 0 for lv in result["levels"]) else 1


async def _smoke(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.server import gateway_app, serve
    from realtime_engine.engines.fake import FakeEngine

    engine = FakeEngine(
        realtime_factor=args.engine_rtf, first_chunk_delay_s=args.first_chunk_delay_ms / 1000
    )
    cfg = _sweep_config(args)
    extra = {
        "engine": "fake",
        "engine_rtf": args.engine_rtf,
        "first_chunk_delay_ms": args.first_chunk_delay_ms,
        "format": args.format,
        "audio_seconds": args.audio_seconds,
    }
    result = new_result("smoke", cfg, extra, argv)
    async with serve(gateway_app(engine)) as url:
        levels, rows = await sweep(
            _gateway_target(args, url), cfg, "gateway", progress=not args.no_progress
        )
    result["levels"] = levels
    result["streams"] = rows
    write_outputs(result, args.out, "smoke")
    return 0 if all(lv["ok"] > 0 for lv in levels) else 1


async def _overhead(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.overhead import OverheadConfig, run_overhead

    cfg = OverheadConfig(
        sessions=args.sessions,
        engine_rtf=args.engine_rtf,
        first_chunk_delay_s=args.first_chunk_delay_ms / 1000,
        ramp_s=args.ramp,
        warmup_s=args.warmup,
        duration_s=args.duration,
        output_format=args.format,
        sample_rate=args.sample_rate,
        decode=not args.no_decode,
        seed=args.seed,
        words_per_text=args.words,
        frame_ms=args.frame_ms,
    )
    result = await run_overhead(cfg, argv, progress=not args.no_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "overhead.json"
    path.write_text(json.dumps(result, indent=1))
    from bench.overhead import plot_lateness, summary_line

    plot_lateness(result, args.out / "overhead_lateness.png")
    print(summary_line(result), file=sys.stderr)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0 if result["sessions_ok"] > 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--smoke"]:  # `python -m bench --smoke` reads naturally in CI scripts
        argv[0] = "smoke"
    args = build_parser().parse_args(argv)
    handler = {"run": _run, "smoke": _smoke, "overhead": _overhead}[args.command]
    return asyncio.run(handler(args, argv))
