"""Summarise a ``py-spy record --format raw --threads`` profile, per thread.

``run_h200.sh`` records the gateway and vLLM's engine core this way at the
levels in ``PROFILE_LEVELS``. For each of the busiest threads this prints how
many samples it has (at ``--rate`` Hz, a thread busy the whole window has
``rate × seconds``), the functions whose frames are on its stack most often
(inclusive share) and where the samples end (self share)::

    python -m bench.gpu.pyspy_summary pyspy_sweep_c256_engine_2219.txt.gz --top 40
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


@dataclass
class ThreadProfile:
    name: str
    samples: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)
    own: Counter[str] = field(default_factory=Counter)


def function_of(frame: str) -> str:
    """``name (file.py:123)`` without its line: one entry per function."""
    return _LINE.sub(")", frame)


def parse(lines: Iterable[str]) -> dict[str, ThreadProfile]:
    """Raw py-spy lines (``thread;frame;...;frame count``) into per-thread counts."""
    threads: dict[str, ThreadProfile] = {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        thread, *frames = stack.split(";")
        profile = threads.setdefault(thread, ThreadProfile(thread))
        profile.samples += n
        if frames:
            profile.own[frames[-1]] += n
        for function in dict.fromkeys(function_of(f) for f in frames):  # once per stack
            profile.inclusive[function] += n
    return threads


def report(threads: dict[str, ThreadProfile], top: int, busiest: int) -> Iterator[str]:
    ranked = sorted(threads.values(), key=lambda t: -t.samples)
    for t in ranked:
        yield f"{t.samples:7d} samples  {t.name}"
    for t in ranked[:busiest]:
        yield ""
        yield f"## {t.name}: {t.samples} samples; inclusive share"
        for function, n in t.inclusive.most_common(top):
            yield f"{100 * n / t.samples:6.1f}%  {function}"
        yield "-- where the samples end (self)"
        for frame, n in t.own.most_common(min(top, 15)):
            yield f"{100 * n / t.samples:6.1f}%  {frame}"


def _open(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    # py-spy copies names out of the target's memory: a torn read can leave
    # bytes that are not UTF-8, which must not lose the rest of the profile
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path, help="raw py-spy output (.txt or .txt.gz)")
    parser.add_argument("--top", type=int, default=30, help="functions per thread")
    parser.add_argument("--threads", type=int, default=2, help="busiest threads detailed")
    args = parser.parse_args(argv)
    for line in report(parse(_open(args.profile)), args.top, args.threads):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
