"""PNG plots of a bench result (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")


def _series(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Levels grouped by target label ("gateway", "peer", ...)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for level in result["levels"]:
        out.setdefault(level.get("target", "gateway"), []).append(level)
    return out


def ttfa_cdf(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
    for target, levels in _series(result).items():
        for level in levels:
            sample = sorted(level.get("samples", {}).get("ttfa_ms", []))
            if not sample:
                continue
            ys = [(i + 1) / len(sample) for i in range(len(sample))]
            ax.step(sample, ys, where="post", label=f"{target} {level['mode']} {level['level']:g}")
    ax.set_xlabel("client TTFA (ms)")
    ax.set_ylabel("fraction of streams")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    _legend(ax)
    ax.set_title("Time to first audio, CDF")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def vs_level(result: dict[str, Any], path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    for target, levels in _series(result).items():
        levels = sorted(levels, key=lambda lv: lv["level"])
        xs = [lv["level"] for lv in levels]
        for p, style in (("p50", "-o"), ("p90", "--s"), ("p99", ":^")):
            ys = [lv["ttfa_ms"].get(p) for lv in levels]
            ax1.plot(
                xs, [y if y is not None else float("nan") for y in ys], style, label=f"{target} {p}"
            )
        ax2.plot(xs, [lv["throughput_audio_s_per_s"] or 0.0 for lv in levels], "-o", label=target)
    mode = result["levels"][0]["mode"] if result["levels"] else "closed"
    xlabel = "concurrency" if mode == "closed" else "arrival rate (streams/s)"
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel("client TTFA (ms)")
    ax1.set_title("TTFA vs load")
    ax2.set_xlabel(xlabel)
    ax2.set_ylabel("audio seconds / second")
    ax2.set_title("Throughput vs load")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def gap_histogram(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
    for target, levels in _series(result).items():
        gaps = [g for lv in levels for g in lv.get("samples", {}).get("gap_ms", [])]
        if gaps:
            ax.hist(gaps, bins=60, alpha=0.6, label=target, log=True)
    threshold = result.get("config", {}).get("underrun_threshold_ms")
    if threshold:
        ax.axvline(threshold, color="red", linestyle="--", label=f"{threshold:g} ms")
    ax.set_xlabel("gap between consecutive audio chunks (ms)")
    ax.set_ylabel("chunks (log)")
    ax.set_title("Inter-chunk gaps")
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_all(result: dict[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        out_dir / f"{prefix}ttfa_cdf.png",
        out_dir / f"{prefix}vs_load.png",
        out_dir / f"{prefix}gap_hist.png",
    ]
    ttfa_cdf(result, paths[0])
    vs_level(result, paths[1])
    gap_histogram(result, paths[2])
    return paths
