"""Per-step digests of the server's cumulative histograms, for the run's summary.

``run_h200.sh`` scrapes ``/metrics`` after each step into ``metrics_<step>.txt``.
The histograms there are cumulative over the server's life, so a step's own
share is its file minus the previous step's. Digested:

- ``speech_stage_seconds{stage}``: the mean of each first-audio stage over the
  contexts that reached it during the step (cut streams included, which the
  clients' ``context.done`` tables miss);
- ``speech_event_loop_lag_seconds``: how late the gateway's event loop ran its
  50 ms timer during the step (bucket bounds: "p50 <= 2 ms");
- ``speech_engine_step_seconds`` and ``speech_engine_batch_size``: the
  engine's mean step time and batch (requests per step) over the step's
  half-second samples, and how full its fullest tenth of samples was: how
  many of a level's streams the engine actually had in hand;
- ``speech_engine_rows``, ``speech_talker_audio_seconds`` and
  ``speech_audio_seconds_out``: the audio the talker's rows stand for (40 ms
  a row), the audio it decoded from them, and the share of each never sent
  (made for streams that ended first: a client's cut, or audio read ahead;
  rows also include each request's 7 delay rows).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from realtime_engine.format import FRAMES_PER_SECOND

STAGES = ("queue", "prefill", "first_frame_row", "first_chunk", "encoded", "ttfa")
_LAG = "speech_event_loop_lag_seconds"
_STAGE = "speech_stage_seconds"
_STEP = "speech_engine_step_seconds"
_BATCH = "speech_engine_batch_size"
_MADE = "speech_talker_audio_seconds"
_SENT = "speech_audio_seconds_out"
_ROWS = "speech_engine_rows"

Snapshot = dict[tuple[str, str], float]  # (sample name, label) -> value


def read_snapshot(text: str) -> Snapshot:
    """The stage sums and counts and the loop lag's buckets of one scrape.

    Every value is summed over the labels not kept in its key: the engine's
    data-parallel ``rank`` and, with ``serve --workers N``, the ``worker``
    that counted it (a merged scrape labels each worker's own samples; the
    engine's step and batch families come once, unlabelled).
    """
    out: Snapshot = {}

    def add(key: tuple[str, str], value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for family in text_string_to_metric_families(text):
        if family.name in (_MADE, _SENT, _ROWS):  # counters
            for s in family.samples:
                if s.name.endswith("_total"):
                    add((family.name, ""), s.value)
            continue
        if family.name not in (_STAGE, _LAG, _STEP, _BATCH):
            continue
        for s in family.samples:
            if family.name == _STAGE and s.name.endswith(("_sum", "_count")):
                add((s.name, s.labels["stage"]), s.value)
            elif family.name in (_LAG, _BATCH) and s.name.endswith("_bucket"):
                add((s.name, s.labels["le"]), s.value)
            elif family.name in (_STEP, _BATCH) and s.name.endswith(("_sum", "_count")):
                add((s.name, ""), s.value)
    return out


def _delta(now: Snapshot, before: Snapshot) -> Snapshot:
    return {key: value - before.get(key, 0.0) for key, value in now.items()}


def _bound_ms(le: str) -> str:
    return "inf" if le == "+Inf" else f"{float(le) * 1000:g} ms"


def lag_digest(step: Snapshot) -> str | None:
    """``n samples, p50 <= a, p99 <= b, k over 100 ms`` for one step's loop lag."""
    buckets = sorted(
        ((float(le), le, n) for (name, le), n in step.items() if name == f"{_LAG}_bucket"),
        key=lambda b: b[0],
    )
    if not buckets or buckets[-1][2] <= 0:
        return None
    total = buckets[-1][2]

    def quantile(q: float) -> str:
        need = math.ceil(q * total)
        return next(_bound_ms(le) for _, le, n in buckets if n >= need)

    under_100ms = next((n for bound, _, n in buckets if bound >= 0.1), total)
    return (
        f"{total:.0f} samples, p50 <= {quantile(0.5)}, p99 <= {quantile(0.99)}, "
        f"{total - under_100ms:.0f} over 100 ms"
    )


def stage_digest(step: Snapshot) -> str | None:
    """``stage mean ms`` for each stage reached during the step."""
    parts = []
    for stage in STAGES:
        count = step.get((f"{_STAGE}_count", stage), 0.0)
        if count > 0:
            mean_ms = step[(f"{_STAGE}_sum", stage)] / count * 1000
            parts.append(f"{stage} {mean_ms:.0f}")
    return " / ".join(parts) if parts else None


def engine_digest(step: Snapshot) -> str | None:
    """``n samples, step mean a ms, batch mean b, p90 <= c`` for one step (c: the
    batch bucket that 90% of the samples stay within)."""
    samples = step.get((f"{_STEP}_count", ""), 0.0)
    if samples <= 0:
        return None
    step_ms = step[(f"{_STEP}_sum", "")] / samples * 1000
    batch = step.get((f"{_BATCH}_sum", ""), 0.0) / samples
    buckets = sorted(
        ((float(le), n) for (name, le), n in step.items() if name == f"{_BATCH}_bucket"),
    )
    need = math.ceil(0.9 * samples)
    top = next((bound for bound, n in buckets if n >= need), math.inf)
    return (
        f"{samples:.0f} samples, step mean {step_ms:.1f} ms, batch mean {batch:.0f}, p90 <= {top:g}"
    )


def audio_digest(step: Snapshot) -> str | None:
    """``a s made, b% never sent[; rows for c s, d% never sent]`` for one step
    (None when the talker made no audio)."""
    made = step.get((_MADE, ""), 0.0)
    if made <= 0:
        return None
    sent = step.get((_SENT, ""), 0.0)
    out = f"{made:.0f} s made, {max(0.0, made - sent) / made:.1%} never sent"
    rows_s = step.get((_ROWS, ""), 0.0) / FRAMES_PER_SECOND  # a row completes a frame
    if rows_s > 0:
        out += f"; rows for {rows_s:.0f} s, {max(0.0, rows_s - sent) / rows_s:.1%} never sent"
    return out


def step_lines(out_dir: Path) -> list[str]:
    """One line per step with a scrape, in the run's step order (``steps.tsv``)."""
    steps = out_dir / "steps.tsv"
    if not steps.is_file():
        return []
    before: Snapshot = {}
    lines = []
    for row in steps.read_text().splitlines():
        name = row.split("\t", 1)[0]
        path = out_dir / f"metrics_{name}.txt"
        if not re.fullmatch(r"[\w.-]+", name) or not path.is_file():
            continue
        now = read_snapshot(path.read_text(errors="replace"))
        step = _delta(now, before)
        before = now
        stages, lag, engine = stage_digest(step), lag_digest(step), engine_digest(step)
        audio = audio_digest(step)
        if stages or lag or engine:
            line = f"- {name}: stages (mean ms) {stages or '-'}; event-loop lag {lag or '-'}"
            line += f"; engine {engine}" if engine else ""
            lines.append(line + (f"; talker audio {audio}" if audio else ""))
    return lines
