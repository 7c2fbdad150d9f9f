"""vLLM's own scheduler with playback pacing, stepped in process on a fake clock:
which requests each step schedules, and what vLLM's running list looks like after."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vllm_support.cpu_env import vllm_available

from realtime_engine.format import FRAMES_PER_SECOND, PRESETS, ChunkingParams
from realtime_engine.talker.vllm_engine_config import PACED_SCHEDULER
from realtime_engine.talker.vllm_protocol import PACING_CONFIG_KEY, TalkerArgs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vllm and triton are not installed"),
]


def talker_args(chunking: ChunkingParams | None) -> dict[str, Any]:
    """A request's extra arguments as the talker's runner sends them."""
    args = TalkerArgs(
        correlation_id="c",
        endpoint="tcp://127.0.0.1:1",
        audio_token_id=1,
        eos_token_id=2,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        ras_window=0,
        ras_max_repeat=0,
        seed=0,
        eoc_not_before=0,
        eoc_at=0,
        chunking=None if chunking is None else TalkerArgs.chunking_fields(chunking),
    )
    return args.to_extra_args()


AUDIO = talker_args(PRESETS["exact"])
ROWS_ONLY = talker_args(None)
ROW_S = 1 / FRAMES_PER_SECOND


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(tiny_checkpoint: Path, *, async_scheduling: bool, **pacing: Any) -> Any:
    from vllm_support.cpu_env import apply_cpu_vllm_env

    apply_cpu_vllm_env()
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from realtime_engine.talker.vllm_plugin import register

    register()
    config = VllmConfig(
        model_config=ModelConfig(model=str(tiny_checkpoint), skip_tokenizer_init=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=512,
            is_encoder_decoder=False,
            scheduler_cls=PACED_SCHEDULER,
        ),
        cache_config=CacheConfig(block_size=16, enable_prefix_caching=False),
        additional_config={PACING_CONFIG_KEY: pacing},
    )
    config.scheduler_config.async_scheduling = async_scheduling
    config.cache_config.num_gpu_blocks = 256
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=256, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["attn"], spec)]
    )
    make = config.scheduler_config.get_scheduler_cls()
    return make(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
        log_stats=False,
    )


def add(scheduler: Any, request_id: str, extra_args: dict[str, Any] = AUDIO) -> None:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=400, extra_args=extra_args)
    scheduler.add_request(Request(request_id, [1] * 10, params, None))


def step(scheduler: Any, clock: FakeClock) -> list[str]:
    """One step: schedule, a row for every scheduled request, a row's time passes."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    result = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[[5] for _ in ids],
    )
    scheduler.update_from_output(out, result)
    clock.now += ROW_S / 4  # the talker at four times real time
    return ids


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def paced(tiny_checkpoint: Path, request: pytest.FixtureRequest) -> Callable[..., Any]:
    def build(**pacing: Any) -> tuple[Any, FakeClock]:
        scheduler = make_scheduler(tiny_checkpoint, async_scheduling=request.param, **pacing)
        clock = FakeClock()
        scheduler.clock = clock
        return scheduler, clock

    return build


def test_the_scheduler_is_vllms_own_class_for_the_mode(paced: Callable[..., Any]) -> None:
    scheduler, _ = paced()
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert isinstance(scheduler, Scheduler)
    assert isinstance(scheduler, AsyncScheduler) == scheduler.scheduler_config.async_scheduling


def test_over_the_cap_the_most_buffered_audio_waits_and_newcomers_decode(
    paced: Callable[..., Any],
) -> None:
    scheduler, clock = paced(max_decode_batch=4, min_buffer_s=0.5)
    for rid in ("a", "b", "c"):
        add(scheduler, rid)
    add(scheduler, "rows", ROWS_ONLY)
    # At the cap nobody waits; at four times real time each audio request
    # builds up 0.03 s of buffer a step.
    for _ in range(80):
        assert sorted(step(scheduler, clock)) == ["a", "b", "c", "rows"]
    assert scheduler.held_steps == 0
    # A newcomer is admitted and decodes with the rest (it was not running yet
    # when this step's batch was chosen).
    add(scheduler, "new")
    assert sorted(step(scheduler, clock)) == ["a", "b", "c", "new", "rows"]
    # Five running against a cap of four: one of the buffered audio requests
    # waits each step (never the newcomer, never the rows request), and they
    # take turns.
    counts = dict.fromkeys("abc", 0)
    for _ in range(30):
        scheduled = step(scheduler, clock)
        assert len(scheduled) == 4 and {"new", "rows"} <= set(scheduled)
        for rid in set(scheduled) & set(counts):
            counts[rid] += 1
    assert scheduler.held_steps == 30
    assert sum(counts.values()) == 60 and max(counts.values()) - min(counts.values()) <= 1
    # vLLM's running list has everyone back after every step.
    assert sorted(r.request_id for r in scheduler.running) == ["a", "b", "c", "new", "rows"]


def test_a_stream_near_its_listener_decodes_even_over_the_cap(
    paced: Callable[..., Any],
) -> None:
    scheduler, clock = paced(max_decode_batch=1, min_buffer_s=5.0)
    for rid in "abc":
        add(scheduler, rid)
    # Nobody has 5 s buffered within these steps: the cap gives way to the floor.
    for _ in range(100):
        assert sorted(step(scheduler, clock)) == list("abc")
    assert scheduler.held_steps == 0


def test_pacing_off_or_under_the_cap_schedules_everyone(paced: Callable[..., Any]) -> None:
    for pacing in ({"max_decode_batch": 0}, {"max_decode_batch": 8, "min_buffer_s": 0.0}):
        scheduler, clock = paced(**pacing)
        for rid in "abcd":
            add(scheduler, rid)
        for _ in range(60):
            assert sorted(step(scheduler, clock)) == list("abcd")
        assert scheduler.held_steps == 0


def test_a_preempted_request_keeps_its_first_row_time(paced: Callable[..., Any]) -> None:
    """The first-row times are pruned to vLLM's live requests, not to the
    running ones: a preempted request keeps its own, or on its return its
    listener's buffer would look as full as its rows."""
    scheduler, clock = paced(max_decode_batch=4, min_buffer_s=0.5)
    add(scheduler, "old")
    for _ in range(3):
        step(scheduler, clock)
    first_row_at = scheduler._seen["old"][0]
    # Preempted as vLLM does it under KV pressure, while a hundred finished
    # requests' times wait to be pruned.
    old = scheduler.requests["old"]
    scheduler.running.remove(old)
    scheduler._preempt_request(old, clock.now)
    scheduler._seen.update({f"gone{i}": (clock.now, 34) for i in range(100)})
    clock.now += 1.0
    assert scheduler._held() == []
    assert set(scheduler._seen) == {"old"}
    # Back in the batch, it counts its playback from its first row still.
    assert "old" in step(scheduler, clock)
    assert scheduler._seen["old"][0] == first_row_at


def test_the_paced_scheduler_says_what_it_does_and_vllms_warning_about_it_is_dropped(
    paced: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from realtime_engine.talker.vllm_plugin import PacedSchedulerNotice

    with caplog.at_level(logging.INFO, logger="realtime_engine.talker.vllm_scheduler"):
        scheduler, _ = paced(max_decode_batch=96, min_buffer_s=2.0)
    mode = "asynchronous" if scheduler.scheduler_config.async_scheduling else "synchronous"
    assert "past 96 running, audio streams with 2.0 s or more sent ahead" in caplog.text
    assert f"({mode} scheduling)" in caplog.text

    def warning(scheduler_cls: str) -> logging.LogRecord:
        message = "Using custom scheduler class %s. This scheduler interface is not public"
        return logging.LogRecord(
            "vllm.config.scheduler", 30, "", 0, message, (scheduler_cls,), None
        )

    notice = PacedSchedulerNotice()
    assert not notice.filter(warning(PACED_SCHEDULER))
    assert notice.filter(warning("my.own.Scheduler"))
    assert any(
        isinstance(f, PacedSchedulerNotice)
        for f in logging.getLogger("vllm.config.scheduler").filters
    )  # installed by the plugin's register(), which the scheduler's set-up ran
