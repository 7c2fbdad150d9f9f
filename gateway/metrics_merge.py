"""One Prometheus exposition for every worker process of a server (no I/O here).

With ``serve --workers N`` each process counts its own connections, and a
scrape of ``/metrics`` reaches one of them at random. :func:`merge_expositions`
turns each worker's own exposition (``/metrics?scope=worker``) into one for
the whole server:

- **Worker-level families**: everything a process counts for the sessions,
  contexts and HTTP requests it accepted (sessions, contexts, time to first
  audio, stages, errors, queues, the event loop's lag, voices), its own view
  of the engine's health (``speech_engine_up``, ``speech_engine_deaths``), and
  the per-rank ``speech_talker_*`` families. Every sample keeps its value and
  gets a ``worker="<index>"`` label, so that ``sum without (worker) (...)``
  answers for the server.
- **Engine-level families** (:data:`ENGINE_FAMILIES`) describe the one engine
  that every worker shares, not a worker's own traffic: each worker's
  ``EngineStatsSampler`` (``gateway.metrics``) turns the same engine-wide
  cumulative counters (``engine.stats()``) into them, so a sum over workers
  would count every step N times. They come once, unlabelled. The workers'
  views differ only in when they last heard from the engine (the vLLM
  talker's engine cores send their counters beside the audio, to the workers
  with requests in them; an idle worker's view stands still). A gauge
  (``speech_engine_waiting_requests``) is the freshest worker's: the one whose
  ``speech_engine_steps_total`` (then ``speech_engine_rows_total``) is
  largest (ties: the lowest index). A counter or histogram series is the
  largest that any worker has: for the steps and rows counters that is the
  freshest worker's value again; the histograms are each worker's own series
  of samples (one per second that it heard from the engine), and the largest
  keeps every series from falling between two scrapes when another worker
  becomes the freshest (a fall would read as a counter reset to Prometheus).

The ``speech_talker_*`` families look engine-wide but are not: the talker
runner counts them (``RankStats``) from the audio chunks of the streams that
its own process started, so they add up over workers like sessions do.

Two gauges are added: ``speech_gateway_workers`` (workers in all) and
``speech_gateway_workers_unreachable`` (workers whose exposition was missing
or unreadable this time; their samples are left out, the rest still answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

WORKER_LABEL = "worker"

# Fed only by ``EngineStatsSampler`` from the engine's cumulative ``stats()``
# (``tests/test_metrics_merge.py`` checks that this is exactly what it feeds).
ENGINE_FAMILIES: frozenset[str] = frozenset(
    {
        "speech_engine_steps",
        "speech_engine_rows",
        "speech_engine_step_seconds",
        "speech_engine_step_seconds_by_batch",
        "speech_engine_batch_size",
        "speech_engine_waiting_requests",
    }
)

WORKERS = "speech_gateway_workers"
UNREACHABLE = "speech_gateway_workers_unreachable"

_CREATED = "_created"
_CUMULATIVE = ("counter", "histogram")


def is_engine_family(name: str) -> bool:
    """``name`` (a parsed family's name) is engine-level, its ``_created`` series included."""
    if name.endswith(_CREATED) and name[: -len(_CREATED)] in ENGINE_FAMILIES:
        return True
    return name in ENGINE_FAMILIES


def merge_expositions(texts: Sequence[str | None], *, shared_engine: bool = True) -> bytes:
    """The server's exposition from ``texts[i]``, worker ``i``'s own (None: not reached).

    A text the parser refuses counts as unreachable too. ``shared_engine``
    False (every worker runs an engine of its own): the engine's families are
    each worker's own as well, labelled like the rest.
    """
    parsed: dict[int, list[Metric]] = {}
    for index, text in enumerate(texts):
        if text is None:
            continue
        try:
            parsed[index] = list(text_string_to_metric_families(text))
        except Exception:  # a garbled answer is a worker not heard from
            continue
    return generate_latest(_Merged(parsed, len(texts), shared_engine))


class _Merged(Collector):
    def __init__(self, parsed: dict[int, list[Metric]], workers: int, shared: bool) -> None:
        self._parsed = parsed
        self._workers = workers
        self._shared = shared

    def collect(self) -> Iterable[Metric]:
        return list(_merge(self._parsed, self._workers, self._shared))


def _merge(parsed: dict[int, list[Metric]], workers: int, shared: bool) -> Iterator[Metric]:
    def engine_family(name: str) -> bool:
        return shared and is_engine_family(name)

    merged: dict[str, Metric] = {}
    for index in sorted(parsed):
        for family in parsed[index]:
            if engine_family(family.name) or family.name in (WORKERS, UNREACHABLE):
                continue
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(family.name, family.documentation, family.type)
            elif out.type != family.type:
                continue  # workers of different versions disagree: the first one's kept
            worker = str(index)
            out.samples.extend(
                s._replace(labels={WORKER_LABEL: worker, **s.labels}) for s in family.samples
            )
    engine: dict[str, Metric] = {}
    for index in _freshest_first(parsed):
        for family in parsed[index]:
            if not engine_family(family.name):
                continue
            out = engine.get(family.name)
            if out is None:
                out = engine[family.name] = Metric(family.name, family.documentation, family.type)
                out.samples = list(family.samples)
            elif out.type == family.type and family.type in _CUMULATIVE:
                _keep_largest(out, family)
    # Each family where it first appeared in worker order (engine ones included).
    for index in sorted(parsed):
        for family in parsed[index]:
            source = engine if engine_family(family.name) else merged
            out = source.pop(family.name, None)
            if out is not None:
                yield out
    yield GaugeMetricFamily(WORKERS, "Gateway worker processes in all", value=workers)
    yield GaugeMetricFamily(
        UNREACHABLE,
        "Gateway workers whose metrics could not be read for this scrape (left out)",
        value=workers - len(parsed),
    )


def _keep_largest(out: Metric, family: Metric) -> None:
    """Each series of ``out`` at the larger of its value and ``family``'s (series that only
    ``family`` has are added)."""
    at = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(out.samples)}
    for s in family.samples:
        i = at.get((s.name, tuple(sorted(s.labels.items()))))
        if i is None:
            out.samples.append(s)
        elif s.value > out.samples[i].value:
            out.samples[i] = out.samples[i]._replace(value=s.value)


def _engine_progress(families: list[Metric]) -> tuple[float, float]:
    steps = rows = 0.0
    for family in families:
        for s in family.samples:
            if s.name == "speech_engine_steps_total":
                steps = s.value
            elif s.name == "speech_engine_rows_total":
                rows = s.value
    return steps, rows


def _freshest_first(parsed: dict[int, list[Metric]]) -> list[int]:
    """Worker indexes, the one that saw the engine furthest along first."""
    progress = {index: _engine_progress(families) for index, families in parsed.items()}
    return sorted(parsed, key=lambda i: (-progress[i][0], -progress[i][1], i))
