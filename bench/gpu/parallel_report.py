"""One GPU vs data parallel vs tensor parallel: what ``run_h200_x2.sh`` leaves in ``parallel.md``.

python -m bench.gpu.parallel_report one=DIR dp2=DIR tp2=DIR > parallel.md

Each ``DIR`` is one layout's results folder (``$WORK/results_<layout>`` on the
GPU machine, or ``results_<layout>/`` unpacked from ``h200_<layout>.tar.gz``)
holding ``presets.json`` and ``sweep.json`` (merged by ``report.py``) and the
``/metrics`` scrape after each sweep level. The capacity of a layout is the
largest swept concurrency at which no stream underran and the p95 client
TTFA was at most ``TTFA_BOUND_MS``; ratios are against the ``one`` layout.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TTFA_BOUND_MS = 250.0
PRESETS = ("latency", "balanced", "exact")
THROUGHPUT_LEVEL = 64
_RANK_STREAMS = re.compile(r"^speech_talker_streams_total\{([^}]*)\} ([0-9.e+]+)$", re.M)
_RANK = re.compile(r'(?:^|,)rank="(\d+)"')


@dataclass(frozen=True)
class Layout:
    name: str
    ttfa_c1_ms: dict[str, float]  # preset -> client TTFA p50 at concurrency 1
    levels: list[dict[str, Any]]  # the sweep's levels, by concurrency
    rank_streams: dict[int, float]  # streams each data-parallel rank served (last level scraped)


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def read_layout(name: str, folder: Path) -> Layout:
    ttfa: dict[str, float] = {}
    presets = _load(folder / "presets.json")
    for level in (presets or {}).get("levels", []):
        preset = str(level.get("target", "")).split()[-1]
        p50 = level.get("ttfa_ms", {}).get("p50")
        if preset in PRESETS and p50 is not None:
            ttfa[preset] = float(p50)
    sweep = _load(folder / "sweep.json")
    levels = sorted((sweep or {}).get("levels", []), key=lambda lv: int(lv["level"]))
    ranks: dict[int, float] = {}
    scrapes = sorted(
        folder.glob("metrics_sweep_c*.txt"), key=lambda p: int(p.stem.rsplit("c", 1)[-1])
    )
    if scrapes:
        ranks = rank_streams(scrapes[-1].read_text())
    return Layout(name, ttfa, levels, ranks)


def rank_streams(scrape: str) -> dict[int, float]:
    """Streams each data-parallel rank served, from a ``/metrics`` scrape; summed over
    the ``worker`` label that a server with several workers adds."""
    out: dict[int, float] = {}
    for labels, value in _RANK_STREAMS.findall(scrape):
        rank = _RANK.search(labels)
        if rank is not None:
            out[int(rank[1])] = out.get(int(rank[1]), 0.0) + float(value)
    return out


def meets_bound(level: dict[str, Any]) -> bool:
    """No stream underran, the p95 TTFA is within the bound, and every stream was served."""
    p95 = level.get("ttfa_ms", {}).get("p95")
    return (
        int(level.get("streams_measured") or 0) > 0
        and int(level.get("errors") or 0) == 0
        and int(level.get("streams_with_underrun") or 0) == 0
        and p95 is not None
        and float(p95) <= TTFA_BOUND_MS
    )


def capacity(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest-concurrency level that meets the bound (None: none does)."""
    passing = [lv for lv in levels if meets_bound(lv)]
    return max(passing, key=lambda lv: int(lv["level"])) if passing else None


def _rate(level: dict[str, Any] | None) -> float | None:
    value = None if level is None else level.get("throughput_audio_s_per_s")
    return None if value is None else float(value)


def _level(level: dict[str, Any] | None) -> float | None:
    return None if level is None else float(level["level"])


def _at(levels: list[dict[str, Any]], concurrency: int) -> dict[str, Any] | None:
    return next((lv for lv in levels if int(lv["level"]) == concurrency), None)


def _peak(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    rated = [lv for lv in levels if _rate(lv) is not None]
    return max(rated, key=lambda lv: _rate(lv) or 0.0) if rated else None


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "—" if value is None or not base else f"{value / base:.2f}×"


def table(layouts: list[Layout]) -> str:
    head = (
        "| layout | TTFA p50 at c=1, ms (latency / balanced / exact) | audio-s/s at c=64 "
        f"| capacity: largest c with 0 underrunning streams, p95 TTFA ≤ {TTFA_BOUND_MS:.0f} ms "
        "| audio-s/s at capacity | peak audio-s/s (at c) | streams per rank (last level) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for lay in layouts:
        ttfa = " / ".join(_num(lay.ttfa_c1_ms.get(p)) for p in PRESETS)
        cap, peak = capacity(lay.levels), _peak(lay.levels)
        cap_text = "none" if cap is None else str(cap["level"])
        peak_text = "—" if peak is None else f"{_num(_rate(peak))} ({peak['level']})"
        ranks = ", ".join(f"{r}: {n:.0f}" for r, n in sorted(lay.rank_streams.items())) or "—"
        lines.append(
            f"| {lay.name} | {ttfa} | {_num(_rate(_at(lay.levels, THROUGHPUT_LEVEL)))} "
            f"| {cap_text} | {_num(_rate(cap))} | {peak_text} | {ranks} |"
        )
    base = next((lay for lay in layouts if lay.name == "one"), None)
    if base is not None:
        lines += ["", "Against one GPU (`one`):", ""]
        lines += [
            "| layout | capacity | audio-s/s at capacity | peak audio-s/s |",
            "|---|---|---|---|",
        ]
        base_cap, base_peak = capacity(base.levels), _peak(base.levels)
        for lay in layouts:
            if lay is base:
                continue
            cap, peak = capacity(lay.levels), _peak(lay.levels)
            streams = _ratio(_level(cap), _level(base_cap))
            rate, peak_rate = (
                _ratio(_rate(cap), _rate(base_cap)),
                _ratio(_rate(peak), _rate(base_peak)),
            )
            lines.append(f"| {lay.name} | {streams} | {rate} | {peak_rate} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or any("=" not in a for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    layouts = [read_layout(name, Path(folder)) for name, folder in (a.split("=", 1) for a in args)]
    print("# One GPU, data parallel and tensor parallel (two H200s)\n")
    print(table(layouts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
