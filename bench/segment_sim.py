"""The text segmenter alone under LLM pacing, on a fake clock (no server, no audio).

Feeds the bench texts token by token at a given rate (``bench.textfeed``) and
polls the segmenter at its own deadlines, exactly as the gateway's session
does, so the cuts are the ones a live server makes for the same arrival
times. Deterministic: a quick way to see what a segmenter setting does to
segment lengths before measuring it live (``python -m bench run``).

    python -m bench.segment_sim --rates 4,8,30,100
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.stats import summarize
from bench.textfeed import REPLIES, schedule
from realtime_engine.text.segmenter import Segment, SegmenterConfig, TextSegmenter


@dataclass(frozen=True)
class TimedSegment:
    at_ms: float  # when the segmenter cut it
    segment: Segment


def simulate(text: str, tokens_per_s: float, config: SegmenterConfig) -> list[TimedSegment]:
    """Cut ``text`` streamed at ``tokens_per_s``; the context ends with the last token."""
    segmenter = TextSegmenter(config)
    out: list[TimedSegment] = []
    now = 0.0
    for piece in schedule(text, tokens_per_s):
        at = piece.offset_s * 1000
        # Timers that fire before this piece arrives, in order.
        while (deadline := segmenter.next_deadline_ms()) is not None and deadline < at:
            now = max(now, deadline)
            out += [TimedSegment(now, s) for s in segmenter.poll(now)]
        now = at
        out += [TimedSegment(now, s) for s in segmenter.feed(piece.text, now)]
    out += [TimedSegment(now, s) for s in segmenter.end()]
    return out


def length_table(
    rates: list[float], configs: dict[str, SegmenterConfig], texts: tuple[str, ...] = REPLIES
) -> str:
    """Markdown: segment lengths (characters, spoken text) per rate and configuration."""
    lines = [
        "| tokens/s | segmenter | segments per text | first segment chars p50 "
        "| later segment chars p10 / p50 / p90 | pieces of 1-2 words |",
        "|---|---|---|---|---|---|",
    ]
    for rate in rates:
        for name, config in configs.items():
            runs = [simulate(text, rate, config) for text in texts]
            first = [len(run[0].segment.speech_text) for run in runs]
            later = [t.segment.speech_text for run in runs for t in run[1:]]
            lengths = sorted(len(t) for t in later)
            short = sum(1 for t in later if len(t.split()) <= 2)
            tenth = lengths[len(lengths) // 10] if lengths else 0
            stats = summarize([float(n) for n in lengths], 1)
            lines.append(
                f"| {rate:g} | {name} | {sum(len(r) for r in runs) / len(runs):.1f} "
                f"| {summarize([float(n) for n in first], 1).get('p50', '-')} "
                f"| {tenth} / {stats.get('p50', '-')} / {stats.get('p90', '-')} "
                f"| {short} of {len(later)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="4,8,30,100", help="tokens per second, comma-separated")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    default = SegmenterConfig()
    configs = {
        "time cut at 250 ms (no slack)": SegmenterConfig(speech_ms_per_char=0),
        f"slack-aware (default, synthesis_rtf={default.synthesis_rtf:g})": default,
        "slack-aware, faster engine (synthesis_rtf=0.5)": SegmenterConfig(synthesis_rtf=0.5),
    }
    print(length_table(rates, configs))


if __name__ == "__main__":
    main()
