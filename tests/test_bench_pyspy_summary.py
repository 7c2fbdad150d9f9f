"""``bench.gpu.pyspy_summary`` on a small raw py-spy profile written here."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bench.gpu.pyspy_summary import function_of, main, parse

RAW = """\
thread (1): MainThread;run (core.py:10);step (core.py:20);decode (audio.py:5) 6
thread (1): MainThread;run (core.py:10);step (core.py:21);decode (audio.py:7) 2
thread (1): MainThread;run (core.py:10);schedule (sched.py:3) 2
thread (2): sender;_drain (audio.py:40);synchronize (streams.py:254) 5
"""


def test_counts_are_per_thread_and_each_function_once_per_stack() -> None:
    threads = parse(RAW.splitlines())
    main_thread = threads["thread (1): MainThread"]
    assert main_thread.samples == 10
    assert threads["thread (2): sender"].samples == 5
    # two lines of step and of decode fold into one function each
    assert main_thread.inclusive["step (core.py)"] == 8
    assert main_thread.inclusive["decode (audio.py)"] == 8
    assert main_thread.inclusive["run (core.py)"] == 10
    assert main_thread.own["decode (audio.py:5)"] == 6


def test_a_recursive_function_counts_once() -> None:
    threads = parse(["t;f (a.py:1);f (a.py:2);f (a.py:3) 4"])
    assert threads["t"].inclusive["f (a.py)"] == 4


def test_function_of_strips_only_the_line() -> None:
    assert function_of("peek (realtime_engine/codec/stream_core.py:155)") == (
        "peek (realtime_engine/codec/stream_core.py)"
    )


def test_the_command_reads_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(RAW)
    assert main([str(path), "--top", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "     10 samples  thread (1): MainThread" in out
    assert " 80.0%  step (core.py)" in out
    assert "sender; inclusive" not in out  # only the busiest thread is detailed


def test_bytes_that_are_not_utf8_cost_only_their_own_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.txt"
    torn = b"thread (3): other;f\xf9\xfe (x.py:1) 4\n"
    path.write_bytes(RAW.encode() + torn)
    assert main([str(path), "--top", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "     10 samples  thread (1): MainThread" in out
    assert "      4 samples  thread (3): other" in out
