"""Run load levels against one target and collect summaries for the JSON report."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm import tqdm

from bench.load import LoadResult, StreamFn, closed_loop, open_loop
from bench.playback import DEFAULT_UNDERRUN_THRESHOLD_S
from bench.records import StreamRecord, derive
from bench.report import level_samples, summarize_level
from bench.sysinfo import describe
from bench.textfeed import TEXTS


@dataclass
class SweepConfig:
    mode: str = "closed"  # "closed": levels are concurrencies; "open": arrival rates (1/s)
    levels: list[float] = field(default_factory=lambda: [1.0, 4.0, 16.0])
    warmup_s: float = 5.0
    duration_s: float = 30.0
    seed: int = 0
    tokens_per_s: float | None = 30.0
    prebuffer_s: float = 0.0
    underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S
    texts: tuple[str, ...] = TEXTS
    raw: bool = False  # keep every stream's timestamps and chunks in the JSON

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["texts"] = len(self.texts)
        out["underrun_threshold_ms"] = self.underrun_threshold_s * 1000.0
        return out


def stream_row(record: StreamRecord, level: float, in_window: bool) -> dict[str, Any]:
    """One compact line per stream for the JSON (no per-chunk data)."""
    m = derive(record)
    return {
        "target": record.target,
        "level": level,
        "stream": record.stream_id,
        "in_window": in_window,
        "ok": m.ok,
        "error": record.error,
        "text_chars": record.text_chars,
        "connect_ms": None if m.connect_s is None else round(m.connect_s * 1000, 2),
        "ttfa_ms": None if m.ttfa_s is None else round(m.ttfa_s * 1000, 2),
        "ttfa_decoded_ms": None if m.ttfa_decoded_s is None else round(m.ttfa_decoded_s * 1000, 2),
        "server_ttfa_ms": m.server_ttfa_ms,
        "audio_s": round(m.audio_s, 4),
        "rtf": None if m.rtf is None else round(m.rtf, 4),
        "chunks": m.chunks,
        "max_gap_ms": None if m.max_gap_s is None else round(m.max_gap_s * 1000, 2),
        "stall_s": round(m.stall_s, 4),
        "underruns": m.underruns,
        "first_underrun_audio_s": (
            None if m.first_underrun_audio_s is None else round(m.first_underrun_audio_s, 3)
        ),
    }


async def run_level(
    stream: StreamFn, cfg: SweepConfig, level: float, label: str, progress: bool
) -> LoadResult:
    bar = tqdm(
        desc=f"{label} {cfg.mode} {level:g}",
        unit="stream",
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )
    try:
        if cfg.mode == "closed":
            return await closed_loop(
                stream,
                int(level),
                cfg.warmup_s,
                cfg.duration_s,
                cfg.texts,
                cfg.seed,
                on_done=lambda _: bar.update(),
            )
        if cfg.mode == "open":
            return await open_loop(
                stream,
                level,
                cfg.warmup_s,
                cfg.duration_s,
                cfg.texts,
                cfg.seed,
                on_done=lambda _: bar.update(),
            )
        raise ValueError(f"unknown load mode {cfg.mode!r}")
    finally:
        bar.close()


async def sweep(
    stream: StreamFn, cfg: SweepConfig, label: str, progress: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every level in order; returns (level summaries, per-stream rows)."""
    levels: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for level in cfg.levels:
        result = await run_level(stream, cfg, level, label, progress)
        summary = summarize_level(result, cfg.prebuffer_s, cfg.underrun_threshold_s)
        summary["target"] = label
        summary["samples"] = level_samples(result)
        levels.append(summary)
        measured = {id(r) for r in result.in_window()}
        for r in result.records:
            row = stream_row(r, level, id(r) in measured)
            if cfg.raw:  # every timestamp and chunk, seconds from the level's start
                row["record"] = r.to_json(t0=result.t_begin)
            rows.append(row)
        if progress:
            print(format_level(summary), file=sys.stderr)
    return levels, rows


def format_level(s: dict[str, Any]) -> str:
    t = s["ttfa_ms"]
    return (
        f"[bench] {s['target']} {s['mode']} {s['level']:g}:"
        f" ok {s['ok']}/{s['streams_measured']}"
        f"  TTFA p50 {t.get('p50')} p90 {t.get('p90')} p99 {t.get('p99')} ms"
        f"  RTF p50 {s['rtf'].get('p50')}  {s['throughput_audio_s_per_s']} audio-s/s"
        f"  underruns {s['underruns_total']} in {s['streams_with_underrun']} streams"
    )


def new_result(
    kind: str, cfg: SweepConfig, extra_config: dict[str, Any], argv: list[str] | None
) -> dict[str, Any]:
    return {
        "meta": {
            "kind": kind,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": argv or [],
            "hardware": describe(),
        },
        "config": {**cfg.to_json(), **extra_config},
        "levels": [],
        "streams": [],
    }


def table(levels: list[dict[str, Any]]) -> str:
    """Markdown table of level summaries."""
    head = (
        "| target | load | streams | TTFA p50 / p90 / p99 ms | server TTFA p50 ms | RTF p50 "
        "| audio-s/s | underruns (streams), first at p50 audio-s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for s in levels:
        t = s["ttfa_ms"]
        first = (s.get("first_underrun_audio_s") or {}).get("p50")
        where = "" if first is None else f", first at {first} s"
        lines.append(
            f"| {s['target']} | {s['mode']} {s['level']:g} | {s['ok']}/{s['streams_measured']} "
            f"| {t.get('p50')} / {t.get('p90')} / {t.get('p99')} "
            f"| {s['server_ttfa_ms'].get('p50')} "
            f"| {s['rtf'].get('p50')} | {s['throughput_audio_s_per_s']} "
            f"| {s['underruns_total']} ({s['streams_with_underrun']}){where} |"
        )
    return "\n".join(lines)
