"""The start-up heap is frozen out of the collector's full passes once the engine is warm."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from gateway_support import fake_app
from starlette.testclient import TestClient

from gateway.gc_heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # later tests collect as usual


def test_freezing_moves_survivors_out_of_full_collections(unfrozen: None) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    kept = [Node() for _ in range(1000)]
    before = len(gc.get_objects())
    frozen = freeze_startup_heap()
    # Other threads of this process may free frozen objects meanwhile; nothing
    # joins the frozen generation without another freeze.
    assert frozen >= gc.get_freeze_count() >= 1000
    # a full pass now walks only what is made after the freeze
    assert len(gc.get_objects()) < before - 1000
    assert not any(obj is kept[0] for obj in gc.get_objects())
    # and objects made afterwards are still collected
    Node()
    assert gc.collect() >= 1


def test_the_app_freezes_once_the_engine_is_warm_only_when_asked(unfrozen: None) -> None:
    with TestClient(fake_app()) as client:
        assert client.get("/ready").status_code == 200
        assert gc.get_freeze_count() == 0  # in-process apps leave gc alone by default
    with TestClient(fake_app(freeze_gc_heap=True)) as client:
        assert client.get("/ready").status_code == 200
        assert gc.get_freeze_count() > 0


def test_the_pause_benchmark_reports_both_passes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.gc_pause", "--engine", "fake", "--repeat", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["frozen_objects"] >= result["tracked_objects"] > 10_000
    assert len(result["full_pass_ms_before"]) == len(result["full_pass_ms_after"]) == 2
    # a frozen heap leaves the full pass nothing of the start-up objects to walk
    assert max(result["full_pass_ms_after"]) < min(result["full_pass_ms_before"])
