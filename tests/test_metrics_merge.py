"""Every worker's own /metrics merged into the server's (``gateway.metrics_merge``)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import EngineStatsSampler, GatewayMetrics, RankStatsSampler
from gateway.metrics_merge import (
    ENGINE_FAMILIES,
    UNREACHABLE,
    WORKER_LABEL,
    WORKERS,
    is_engine_family,
    merge_expositions,
)


@dataclass(frozen=True)
class Stats:
    steps: int
    rows: int
    mean_step_s: float
    waiting: int | None = None


@dataclass(frozen=True)
class RankCounters:
    streams: int
    active: int
    chunks: int
    audio_seconds: float


@dataclass(frozen=True)
class RankReport:
    counters: dict[int, RankCounters]
    first_chunk_s: list[tuple[int, float]]


def own(metrics: GatewayMetrics) -> str:
    return metrics.render().decode()


def families(text: str | bytes) -> dict[str, Metric]:
    body = text.decode() if isinstance(text, bytes) else text
    return {f.name: f for f in text_string_to_metric_families(body)}


def values(family: Metric) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample's value by its name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


def by_worker(family: Metric, sample: str) -> dict[str, float]:
    return {s.labels[WORKER_LABEL]: s.value for s in family.samples if s.name == sample}


def check_histograms(merged: dict[str, Metric]) -> None:
    """Every series of every histogram: buckets never fall, and ``+Inf`` is its count."""
    for family in merged.values():
        if family.type != "histogram":
            continue
        buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        counts: dict[tuple[tuple[str, str], ...], float] = {}
        for s in family.samples:
            series = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name.endswith("_bucket"):
                buckets[series].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[series] = s.value
        assert set(buckets) == set(counts), family.name
        for series, bounds in buckets.items():
            assert [b for b, _ in bounds] == sorted(b for b, _ in bounds), family.name
            assert bounds[-1][0] == math.inf, family.name
            ns = [n for _, n in bounds]
            assert ns == sorted(ns), (family.name, series)
            assert ns[-1] == counts[series], (family.name, series)


def test_every_worker_level_sample_gets_its_workers_label() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.sessions_total.inc()
    first.sessions_active.inc()
    second.sessions_total.inc(3)
    second.sessions_refused.labels(reason="session_limit").inc()
    first.error("server_error", "engine_error")
    first.talker_streams.labels(rank="0").inc(2)
    second.talker_streams.labels(rank="0").inc(5)
    second.talker_streams.labels(rank="1").inc()
    merged = families(merge_expositions([own(first), own(second)]))
    assert by_worker(merged["speech_sessions"], "speech_sessions_total") == {"0": 1, "1": 3}
    assert by_worker(merged["speech_sessions_active"], "speech_sessions_active") == {
        "0": 1,
        "1": 0,
    }
    assert values(merged["speech_sessions_refused"]) == {
        ("speech_sessions_refused_total", (("reason", "session_limit"), ("worker", "1"))): 1
    }
    assert values(merged["speech_talker_streams"]) == {
        ("speech_talker_streams_total", (("rank", "0"), ("worker", "0"))): 2,
        ("speech_talker_streams_total", (("rank", "0"), ("worker", "1"))): 5,
        ("speech_talker_streams_total", (("rank", "1"), ("worker", "1"))): 1,
    }
    for name, family in merged.items():
        for s in family.samples:
            labelled = WORKER_LABEL in s.labels
            assert labelled != (is_engine_family(name) or name in (WORKERS, UNREACHABLE)), s


def test_help_and_type_come_once_per_family() -> None:
    workers = [GatewayMetrics() for _ in range(3)]
    for i, metrics in enumerate(workers):
        metrics.observe_stages({"queue": 0.001 * (i + 1), "ttfa": 0.1})
    text = merge_expositions([own(m) for m in workers]).decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(helps) == len(set(helps)) and len(types) == len(set(types))
    alone = own(workers[0])
    own_types = {line.split()[2] for line in alone.splitlines() if line.startswith("# TYPE ")}
    assert set(types) == own_types | {WORKERS, UNREACHABLE}
    # The same families in the same order as one worker's, the two gauges last.
    assert types[:-2] == [line.split()[2] for line in alone.splitlines() if "# TYPE " in line]


def test_engines_of_their_own_are_labelled_per_worker_like_the_rest() -> None:
    """Workers that each run an engine (not the vLLM talker's host): nothing is shared."""
    workers = [GatewayMetrics() for _ in range(2)]
    EngineStatsSampler(workers[0]).observe(Stats(steps=10, rows=40, mean_step_s=0.004))
    EngineStatsSampler(workers[1]).observe(Stats(steps=30, rows=90, mean_step_s=0.006))
    merged = families(merge_expositions([own(m) for m in workers], shared_engine=False))
    assert by_worker(merged["speech_engine_rows"], "speech_engine_rows_total") == {
        "0": 40,
        "1": 90,
    }
    assert by_worker(merged["speech_engine_steps"], "speech_engine_steps_total") == {
        "0": 10,
        "1": 30,
    }
    check_histograms(merged)


def test_engine_families_come_once_unlabelled_and_furthest_along() -> None:
    workers = [GatewayMetrics() for _ in range(3)]
    samplers = [EngineStatsSampler(m) for m in workers]
    # Each worker sampled the same engine at its own moments; worker 1 last.
    samplers[0].observe(Stats(steps=10, rows=40, mean_step_s=0.004, waiting=1))
    samplers[0].observe(Stats(steps=11, rows=44, mean_step_s=0.004, waiting=1))
    samplers[0].observe(Stats(steps=12, rows=48, mean_step_s=0.004, waiting=1))
    samplers[1].observe(Stats(steps=12, rows=50, mean_step_s=0.004, waiting=2))
    samplers[1].observe(Stats(steps=30, rows=200, mean_step_s=0.006, waiting=3))
    samplers[2].observe(Stats(steps=20, rows=100, mean_step_s=0.005, waiting=4))
    merged = families(merge_expositions([own(m) for m in workers]))
    each = [families(own(m)) for m in workers]
    engine = {name for name in merged if is_engine_family(name)}
    assert {name.removesuffix("_created") for name in engine} == ENGINE_FAMILIES
    for name in engine:
        if merged[name].type == "gauge":  # the freshest worker's
            assert values(merged[name]) == values(each[1][name]), name
            continue
        largest: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for own_families in each:
            for key, value in values(own_families[name]).items():
                largest[key] = max(value, largest.get(key, value))
        assert values(merged[name]) == largest, name
    assert values(merged["speech_engine_steps"]) == {("speech_engine_steps_total", ()): 30}
    assert values(merged["speech_engine_rows"]) == {("speech_engine_rows_total", ()): 200}
    assert values(merged["speech_engine_waiting_requests"]) == {
        ("speech_engine_waiting_requests", ()): 3
    }
    step = values(merged["speech_engine_step_seconds"])
    assert step[("speech_engine_step_seconds_count", ())] == 3  # worker 0 took the most samples
    check_histograms(merged)


# One engine's life as the workers see it: the engine steps; a worker polls (and sees
# the engine only while it has requests there: the vLLM talker sends its counters
# only to the workers with requests in it); a scrape merges what the workers hold.
_EVENT = st.one_of(
    st.tuples(st.just("step"), st.integers(1, 50), st.integers(1, 64)),
    st.tuples(st.just("poll"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("scrape"), st.just(0), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=40))
def test_engine_series_never_fall_between_scrapes(events: list[tuple[str, int, int]]) -> None:
    """Whichever worker sampled the engine last, a later scrape never shows an engine
    counter or histogram series lower than an earlier one (Prometheus would read a reset)."""
    workers = [GatewayMetrics() for _ in range(3)]
    samplers = [EngineStatsSampler(m) for m in workers]
    seen = [Stats(0, 0, 0.0, 0) for _ in workers]
    engine = Stats(0, 0, 0.0, 0)
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for kind, a, b in [*events, ("scrape", 0, 0)]:
        if kind == "step":
            steps = engine.steps + a
            total_s = engine.mean_step_s * engine.steps + a * 0.001 * b
            engine = Stats(steps, engine.rows + a * b, total_s / steps, b)
        elif kind == "poll":
            if b:  # this worker has requests in the engine: its counters are current
                seen[a] = engine
            samplers[a].observe(seen[a])
        else:
            merged = families(merge_expositions([own(m) for m in workers]))
            check_histograms(merged)
            now = {
                key: value
                for name, family in merged.items()
                if is_engine_family(name) and family.type in ("counter", "histogram")
                for key, value in values(family).items()
            }
            assert all(now.get(key, 0.0) >= value for key, value in last.items())
            last = now
            furthest = max(s.steps for s in seen)
            assert now[("speech_engine_steps_total", ())] == furthest


def test_without_engine_counters_the_lowest_worker_speaks_for_the_engine() -> None:
    workers = [GatewayMetrics() for _ in range(3)]  # an engine without stats(): all zero
    merged = families(merge_expositions([own(m) for m in reversed(workers)]))
    lowest = families(own(workers[2]))  # index 0 of the merged list
    for name in merged:
        if is_engine_family(name):
            assert values(merged[name]) == values(lowest[name]), name


def test_the_engine_families_are_exactly_what_the_engine_sampler_feeds() -> None:
    """The list in ``gateway.metrics_merge`` against ``gateway.metrics``: the families
    that ``EngineStatsSampler`` (fed from the engine's cumulative ``stats()``) changes."""
    metrics = GatewayMetrics()
    before = families(own(metrics))
    EngineStatsSampler(metrics).observe(Stats(steps=10, rows=40, mean_step_s=0.004, waiting=2))
    after = families(own(metrics))
    changed = {
        name.removesuffix("_created")
        for name in after
        if name not in before or values(after[name]) != values(before[name])
    }
    assert changed == ENGINE_FAMILIES
    # The per-rank talker families are counted from this process's own streams: per worker.
    before = after
    report = RankReport({0: RankCounters(2, 1, 10, 0.8)}, [(0, 0.05)])
    RankStatsSampler(metrics).observe(report)
    after = families(own(metrics))
    changed = {
        name for name in after if name not in before or values(after[name]) != values(before[name])
    }
    assert changed and all(name.startswith("speech_talker_") for name in changed)
    assert not any(is_engine_family(name) for name in changed)


def test_unreachable_or_unreadable_workers_are_left_out_and_counted() -> None:
    reached = GatewayMetrics()
    reached.sessions_total.inc(2)
    merged = families(merge_expositions([None, own(reached), "speech_sessions_total{ 1\n"]))
    assert values(merged[UNREACHABLE]) == {(UNREACHABLE, ()): 2}
    assert values(merged[WORKERS]) == {(WORKERS, ()): 3}
    assert by_worker(merged["speech_sessions"], "speech_sessions_total") == {"1": 2}
    workers = {s.labels.get(WORKER_LABEL) for f in merged.values() for s in f.samples}
    assert workers == {"1", None}
    nobody = families(merge_expositions([None, None]))
    assert values(nobody[UNREACHABLE]) == {(UNREACHABLE, ()): 2}


@dataclass(frozen=True)
class WorkerLoad:
    sessions: int
    ttfa_s: list[float]
    stages: dict[str, float]
    engine_steps: int


_LOAD = st.builds(
    WorkerLoad,
    sessions=st.integers(0, 1000),
    ttfa_s=st.lists(st.floats(0.001, 20.0), max_size=20),
    stages=st.dictionaries(st.sampled_from(["queue", "prefill", "ttfa"]), st.floats(0.0, 3.0)),
    engine_steps=st.integers(0, 10_000),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_LOAD, min_size=1, max_size=5))
def test_the_merge_keeps_every_workers_counts_and_one_engine(loads: list[WorkerLoad]) -> None:
    workers = []
    for load in loads:
        metrics = GatewayMetrics()
        metrics.sessions_total.inc(load.sessions)
        for seconds in load.ttfa_s:
            metrics.ttfa_seconds.observe(seconds)
        metrics.observe_stages(load.stages)
        sampler = EngineStatsSampler(metrics)
        sampler.observe(Stats(load.engine_steps, 3 * load.engine_steps, 0.005))
        workers.append(metrics)
    merged = families(merge_expositions([own(m) for m in workers]))
    check_histograms(merged)
    expected = {str(i): float(load.sessions) for i, load in enumerate(loads)}
    assert by_worker(merged["speech_sessions"], "speech_sessions_total") == expected
    ttfa = merged["speech_ttfa_seconds"]
    counts = by_worker(ttfa, "speech_ttfa_seconds_count")
    assert counts == {str(i): float(len(load.ttfa_s)) for i, load in enumerate(loads)}
    total = sum(by_worker(ttfa, "speech_ttfa_seconds_sum").values())
    assert math.isclose(total, sum(sum(load.ttfa_s) for load in loads), abs_tol=1e-9)
    stage_counts: dict[str, float] = defaultdict(float)
    for s in merged["speech_stage_seconds"].samples:
        if s.name == "speech_stage_seconds_count":
            stage_counts[s.labels["stage"]] += s.value
    expected_stages: dict[str, float] = defaultdict(float)
    for load in loads:
        for stage in load.stages:
            expected_stages[stage] += 1
    assert stage_counts == expected_stages
    steps = max(load.engine_steps for load in loads)
    assert values(merged["speech_engine_steps"]) == {("speech_engine_steps_total", ()): steps}
    rows = values(merged["speech_engine_rows"])
    assert rows == {("speech_engine_rows_total", ()): 3 * steps}
    assert values(merged[UNREACHABLE]) == {(UNREACHABLE, ()): 0}
