"""Turn a load level's records into the numbers the JSON and plots carry."""

from __future__ import annotations

from typing import Any

from bench.load import LoadResult
from bench.playback import DEFAULT_UNDERRUN_THRESHOLD_S
from bench.records import StreamMetrics, audio_in_window, derive
from bench.stats import summarize


def _ms(values: list[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000.0 for v in values]


def summarize_level(
    result: LoadResult,
    prebuffer_s: float = 0.0,
    underrun_threshold_s: float = DEFAULT_UNDERRUN_THRESHOLD_S,
) -> dict[str, Any]:
    """Per-level summary over the streams that started inside the window.

    Throughput counts the audio of every stream (window or not) whose chunks
    arrived inside the window, divided by the window length.
    """
    measured = result.in_window()
    metrics: list[StreamMetrics] = [derive(r, prebuffer_s, underrun_threshold_s) for r in measured]
    ok = [m for m in metrics if m.ok]
    audio_s = audio_in_window(result.records, result.t_window_start, result.t_window_end)
    window_s = result.window_s
    errors = sorted({r.error for r in measured if r.error})
    gaps = [g for m in ok for g in m.gaps_s]
    return {
        "mode": result.mode,
        "level": result.level,
        "streams_started": len(result.records),
        "streams_measured": len(measured),
        "ok": len(ok),
        "errors": len(measured) - len(ok),
        "error_samples": errors[:5],
        "window_s": round(window_s, 4),
        "drain_s": round(result.t_end - result.t_window_end, 4),
        "audio_s_in_window": round(audio_s, 4),
        "throughput_audio_s_per_s": round(audio_s / window_s, 4) if window_s > 0 else None,
        "ttfa_ms": summarize(_ms([m.ttfa_s for m in ok]), 2),
        "ttfa_decoded_ms": summarize(_ms([m.ttfa_decoded_s for m in ok]), 2),
        "server_ttfa_ms": summarize([m.server_ttfa_ms for m in ok], 2),
        "connect_ms": summarize(_ms([m.connect_s for m in ok]), 2),
        "total_ms": summarize(_ms([m.total_s for m in ok]), 2),
        "rtf": summarize([m.rtf for m in ok]),
        "audio_s": summarize([m.audio_s for m in ok]),
        "chunks": summarize([float(m.chunks) for m in ok], 1),
        "gap_ms": summarize(_ms(list(gaps)), 2),
        "max_gap_ms": summarize(_ms([m.max_gap_s for m in ok]), 2),
        "stall_s": summarize([m.stall_s for m in ok]),
        "underrun_s": summarize([m.underrun_s for m in ok]),
        "underruns_total": sum(m.underruns for m in ok),
        "streams_with_underrun": sum(1 for m in ok if m.underruns),
        "first_underrun_audio_s": summarize(
            [m.first_underrun_audio_s for m in ok if m.first_underrun_audio_s is not None]
        ),
        "min_lead_ms": summarize(_ms([m.min_lead_s for m in ok]), 2),
        "server_metrics": server_metric_summaries(
            [r.server_metrics or {} for r in measured if r.ok]
        ),
        **segment_summaries([r.segments for r in measured if r.ok]),
    }


# A segment of this many words or fewer is a "short piece": choppy prosody.
SHORT_SEGMENT_WORDS = 2


def segment_summaries(streams: list[list[tuple[int, str]]]) -> dict[str, Any]:
    """How the server cut the text (from ``segment.started``): lengths in characters.

    The first segment is summarised apart: it is kept short on purpose (TTFA).
    """
    first = [len(segments[0][1].strip()) for segments in streams if segments]
    later = [text.strip() for segments in streams for _, text in segments[1:]]
    short = sum(1 for text in later if len(text.split()) <= SHORT_SEGMENT_WORDS)
    return {
        "segments_per_stream": summarize([float(len(s)) for s in streams], 2),
        "first_segment_chars": summarize([float(n) for n in first], 1),
        "segment_chars": summarize([float(len(text)) for text in later], 1),
        "short_segments": short,
        "later_segments": len(later),
    }


def server_metric_summaries(metrics: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """A summary per numeric field of the server's ``context.done`` metrics."""
    keys = sorted({k for m in metrics for k, v in m.items() if _numeric(v)})
    return {k: summarize([m[k] for m in metrics if _numeric(m.get(k))], 3) for k in keys}


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def level_samples(result: LoadResult) -> dict[str, list[float]]:
    """Raw per-stream samples the plots need (TTFA CDF, gap histogram)."""
    metrics = [derive(r) for r in result.in_window()]
    ok = [m for m in metrics if m.ok]
    return {
        "ttfa_ms": [m.ttfa_s * 1000.0 for m in ok if m.ttfa_s is not None],
        "gap_ms": [g * 1000.0 for m in ok for g in m.gaps_s],
    }


# context.done first-audio stages, in the order they happen on the server
SERVER_STAGES = (
    "queue_ms",
    "prefill_ms",
    "first_row_ms",
    "first_frame_row_ms",
    "first_chunk_ms",
    "encoded_ms",
    "ttfa_ms",
)


def stage_table(levels: list[dict[str, Any]]) -> str:
    """Markdown table of the server's first-audio stages, p50 / p90 ms per level.

    ``-`` marks a stage the engine does not report; empty when no level has
    server metrics (an HTTP or peer target).
    """
    rows = [s for s in levels if any(s.get("server_metrics", {}).get(k) for k in SERVER_STAGES)]
    if not rows:
        return ""
    names = [k.removesuffix("_ms") for k in SERVER_STAGES]
    lines = [
        "| target | load | " + " | ".join(f"{n} p50 / p90" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for s in rows:
        cells = []
        for key in SERVER_STAGES:
            summary = s["server_metrics"].get(key, {})
            cells.append(f"{summary['p50']} / {summary['p90']}" if summary.get("n") else "-")
        label = f"{s.get('target', '')} | {s['mode']} {s['level']:g}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
