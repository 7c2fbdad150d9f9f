"""Merge per-level ``bench run`` results and write the run's summary (used by run_h200.sh).

python -m bench.gpu.report merge DIR NAME [LABEL=]RESULT.json ...   # DIR/NAME.json + DIR/NAME_*.png
python -m bench.gpu.report combine OUT.json PART.json ...           # one level, several clients
python -m bench.gpu.report summary DIR > summary.md                 # tables of DIR/*.json + notes
python -m bench.gpu.report levels DIR > levels.json                 # figures, no streams

Each level of a run is its own ``bench run`` (a level that overruns its time
limit loses only itself); ``merge`` joins them into one result as if one run
had measured every level. ``LABEL=`` renames the target (``gateway`` becomes
``gateway latency``), for runs that differ in their session settings.
``combine`` joins the parts of one level whose streams several client
processes drove side by side (one Python client saturates near a few hundred
streams).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.server_histograms import step_lines
from bench.report import stage_table
from bench.stats import summarize
from bench.sweep import table

# Result files the summary lists, in this order, with a title.
SECTIONS = (
    ("presets", "Time to first audio per latency preset (concurrency 1)"),
    ("sweep", "Closed-loop concurrency sweep (WebSocket, fixed audio length)"),
    ("sweep_b", "Second sweep on the same server (SWEEP_B_ARGS)"),
    ("http", "Gateway over HTTP (same request as the peer)"),
    ("peer", "Peer (vllm-omni) over HTTP"),
    ("fallback", "Gateway with the reference talker (vLLM talker did not start)"),
)


def _relabel(result: dict[str, Any], label: str) -> None:
    for item in (*result["levels"], *result["streams"]):
        item["target"] = f"{item.get('target', 'gateway')} {label}"


def merge(parts: list[tuple[str | None, dict[str, Any]]]) -> dict[str, Any]:
    """One result from several: levels and streams in the given order."""
    if not parts:
        raise ValueError("nothing to merge")
    merged: dict[str, Any] = json.loads(json.dumps(parts[0][1]))
    merged["levels"], merged["streams"] = [], []
    merged["meta"]["argv"] = []
    merged["meta"]["merged_from"] = len(parts)
    merged["config"]["levels"] = []
    for label, result in parts:
        result = json.loads(json.dumps(result))
        if label:
            _relabel(result, label)
        merged["levels"].extend(result["levels"])
        merged["streams"].extend(result["streams"])
        merged["meta"]["argv"].append(result["meta"].get("argv", []))
        merged["config"]["levels"].extend(result["config"].get("levels", []))
    return merged


# per-stream row field -> level summary field, pooled by combine()
_POOLED = (
    ("ttfa_ms", "ttfa_ms", 2),
    ("ttfa_decoded_ms", "ttfa_decoded_ms", 2),
    ("server_ttfa_ms", "server_ttfa_ms", 2),
    ("connect_ms", "connect_ms", 2),
    ("rtf", "rtf", 4),
    ("audio_s", "audio_s", 4),
    ("chunks", "chunks", 1),
    ("max_gap_ms", "max_gap_ms", 2),
    ("stall_s", "stall_s", 4),
    ("first_underrun_audio_s", "first_underrun_audio_s", 3),
)
# summaries that neither per-stream rows nor level samples carry: marked as not pooled
_NOT_POOLED = ("total_ms", "underrun_s", "min_lead_ms")


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One level measured by several client processes at once, as one result.

    Each part is a single-level ``bench run`` result whose clients ran
    side by side with the others' (started together, same warm-up and
    window). The level is the sum of the parts' levels, throughput the sum
    of their throughputs; percentiles are recomputed from the pooled
    per-stream rows (and gap samples), counts are summed.
    """
    if not parts or any(len(p["levels"]) != 1 for p in parts):
        raise ValueError("combine takes single-level results")
    levels = [p["levels"][0] for p in parts]
    if len({lv["mode"] for lv in levels}) != 1:
        raise ValueError("parts measured different load modes")
    out: dict[str, Any] = json.loads(json.dumps(parts[0]))
    streams = [dict(row) for p in parts for row in p["streams"]]
    total = sum(lv["level"] for lv in levels)
    for i, row in enumerate(streams):
        row["level"], row["stream"] = total, i
    measured = [r for r in streams if r.get("in_window")]
    ok = [r for r in measured if r.get("ok")]
    level = dict(levels[0])
    level["level"] = total
    for key in ("streams_started", "streams_measured", "ok", "errors"):
        level[key] = sum(lv.get(key, 0) for lv in levels)
    for key in ("underruns_total", "streams_with_underrun"):
        level[key] = sum(lv.get(key, 0) for lv in levels)
    level["error_samples"] = sorted({e for lv in levels for e in lv.get("error_samples", [])})[:5]
    level["audio_s_in_window"] = round(sum(lv.get("audio_s_in_window", 0.0) for lv in levels), 4)
    rates = [r for lv in levels if (r := lv.get("throughput_audio_s_per_s")) is not None]
    level["throughput_audio_s_per_s"] = round(sum(rates), 4) if rates else None
    for row_key, summary_key, digits in _POOLED:
        level[summary_key] = summarize([r.get(row_key) for r in ok], digits)
    samples = {
        "ttfa_ms": [x for lv in levels for x in lv.get("samples", {}).get("ttfa_ms", [])],
        "gap_ms": [x for lv in levels for x in lv.get("samples", {}).get("gap_ms", [])],
    }
    level["samples"] = samples
    level["gap_ms"] = summarize(samples["gap_ms"], 2)
    for key in _NOT_POOLED:
        level[key] = {"n": 0, "note": "not pooled across client processes"}
    level["server_metrics"] = {}
    level["client_processes"] = len(parts)
    out["levels"] = [level]
    out["streams"] = streams
    out["config"]["levels"] = [total]
    out["meta"]["argv"] = [p["meta"].get("argv", []) for p in parts]
    out["meta"]["client_processes"] = len(parts)
    return out


def cmd_combine(out_path: Path, paths: list[Path]) -> int:
    parts = [json.loads(path.read_text()) for path in paths if path.is_file()]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing or not parts:
        print(f"[report] combine: missing parts {missing}", file=sys.stderr)
        return 1
    out_path.write_text(json.dumps(combine(parts), indent=1))
    return 0


def _parse_part(spec: str) -> tuple[str | None, Path]:
    label, sep, path = spec.partition("=")
    return (label, Path(path)) if sep else (None, Path(spec))


def cmd_merge(out_dir: Path, name: str, specs: list[str]) -> int:
    from bench.cli import write_outputs

    parts = []
    for spec in specs:
        label, path = _parse_part(spec)
        if path.is_file():
            parts.append((label, json.loads(path.read_text())))
        else:
            print(f"[report] {path}: missing (level skipped or failed)", file=sys.stderr)
    if not parts:
        print(f"[report] {name}: no results to merge", file=sys.stderr)
        return 1
    write_outputs(merge(parts), out_dir, name)
    return 0


def summary(out_dir: Path) -> str:
    lines = ["# H200 benchmark run", ""]
    env = out_dir / "env.txt"
    if env.is_file():
        lines += ["## Machine and software", "", "<!-- not runnable: a record of the host -->"]
        lines += ["```", env.read_text().strip(), "```", ""]
    for name, title in SECTIONS:
        path = out_dir / f"{name}.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        cfg = result.get("config", {})
        lines += [f"## {title}", ""]
        http = bool(cfg.get("http")) or not cfg.get("url")
        lines.append(
            f"`{name}.json`: warm-up {cfg.get('warmup_s')} s, window {cfg.get('duration_s')} s, "
            + (
                f"HTTP streaming PCM, max_new_tokens {cfg.get('max_new_tokens')}."
                if http
                else f"WebSocket, text at {cfg.get('tokens_per_s')} tokens/s, "
                f"format {cfg.get('format')}, audio per stream {cfg.get('audio_seconds')} s."
            )
        )
        if cfg.get("audio_seconds") and not http:
            lines.append(
                "Streams are cut at the fixed length (a cancel), so `context.done` and its "
                "server TTFA are not reported for them; the server's stage histograms "
                "(`speech_stage_seconds`) after each level are in `metrics_<level>.txt`."
            )
        lines += ["", table(result["levels"]), ""]
        stages = stage_table(result["levels"])
        if stages:
            lines += ["Server first-audio stages (ms):", "", stages, ""]
        errors = sorted({e for lv in result["levels"] for e in lv.get("error_samples", [])})
        if errors:
            lines += ["Errors (samples):", "", *[f"- `{e}`" for e in errors[:8]], ""]
    per_step = step_lines(out_dir)
    if per_step:
        lines += [
            "## Server histograms per step",
            "",
            "From `metrics_<step>.txt`, each step's share of the cumulative histograms: "
            "first-audio stages after the text was speakable (every context of the step, "
            "warm-up and cut streams included) and the gateway's event-loop lag.",
            "",
            *per_step,
            "",
        ]
    usage = resource_lines(out_dir)
    if usage:
        lines += ["## CPU and GPU use over the run", "", *usage, ""]
    steps = out_dir / "steps.tsv"
    if steps.is_file():
        lines += ["## Steps (name, status, seconds, note)", ""]
        lines += ["<!-- not runnable: a log of the run -->", "```", steps.read_text().strip()]
        lines += ["```", ""]
    return "\n".join(lines)


def resource_lines(out_dir: Path) -> list[str]:
    """Peak CPU per role (a client at ~100 % of a core limits what it can measure) and GPU use."""
    out: list[str] = []
    cpu = out_dir / "cpu.csv"
    if cpu.is_file():
        peaks: dict[str, list[float]] = {}
        with cpu.open() as f:
            for row in csv.DictReader(f):
                try:
                    peaks.setdefault(row["role"], []).append(float(row["cpu_pct"]))
                except (KeyError, ValueError):
                    continue
        for role, values in sorted(peaks.items()):
            values.sort()
            median = values[len(values) // 2]
            out.append(f"- {role}: CPU % of one core, median {median:.0f}, max {values[-1]:.0f}")
    gpu = out_dir / "gpu.csv"
    if gpu.is_file():
        util: list[float] = []
        with gpu.open() as f:
            for fields in csv.reader(f):
                try:
                    util.append(float(fields[1].strip().split()[0]))
                except (IndexError, ValueError):
                    continue
        if util:
            busy = [u for u in util if u > 0]
            mean = sum(busy) / len(busy) if busy else 0.0
            out.append(f"- GPU utilization %: mean while busy {mean:.0f}, max {max(util):.0f}")
    return out


def _is_figure(value: Any) -> bool:
    """A number, a word, or a dict of them (a percentile table): what a level reports."""
    if isinstance(value, dict):
        return all(_is_figure(v) for v in value.values())
    return isinstance(value, (int, float, str, bool)) or value is None


def levels(res_dir: Path) -> dict[str, dict[str, Any]]:
    """Every level of every result in ``res_dir``, keyed ``<file>`` or ``<file>_c<level>``,
    with its figures and without the per-stream records (small enough to bring back)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(res_dir.glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(result, dict) or not isinstance(result.get("levels"), list):
            continue
        for item in result["levels"]:
            if not isinstance(item, dict):
                continue
            name = path.stem
            level = item.get("level")
            if level is not None and not name.endswith(f"_c{level}"):
                name = f"{name}_c{level}"
            out[name] = {k: v for k, v in item.items() if _is_figure(v)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 3 and args[0] == "merge":
        return cmd_merge(Path(args[1]), args[2], args[3:])
    if len(args) >= 3 and args[0] == "combine":
        return cmd_combine(Path(args[1]), [Path(a) for a in args[2:]])
    if len(args) == 2 and args[0] == "levels":
        print(json.dumps(levels(Path(args[1])), indent=1))
        return 0
    if len(args) == 2 and args[0] == "summary":
        print(summary(Path(args[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
