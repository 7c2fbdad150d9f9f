"""The compiled codec's warm-up compiles in parallel even where vLLM pinned Inductor
to one thread, and leaves vLLM's setting and no compile workers behind."""

from __future__ import annotations

import pytest
import torch
from streaming_support import random_tiny_codec
from torch._inductor import async_compile
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from realtime_engine.talker.codec_slots import CodecSlots
from realtime_engine.talker.compile_workers import default_compile_workers, parallel_compile


class CompileThreads(CustomGraphPass):
    """An Inductor pass that runs while a graph compiles: it notes how many compile
    workers Inductor would use for that graph's kernels."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.seen.append(async_compile.get_compile_threads())

    def uuid(self) -> str:
        return "compile-threads-probe"


def test_the_compiled_codec_warms_up_with_a_worker_per_core_where_vllm_pinned_one() -> None:
    probe = CompileThreads()
    # what importing vLLM leaves in every process it starts; and no cached compile
    with inductor_config.patch(
        compile_threads=1, fx_graph_cache=False, post_grad_custom_post_pass=probe
    ):
        torch._dynamo.reset()
        CodecSlots(random_tiny_codec(), 2, kernels="compiled").warm_up()
        assert probe.seen == [default_compile_workers()]  # the step, traced once
        assert inductor_config.compile_threads == 1
        assert len(async_compile._pool_set) == 0  # no compile workers left running


def test_parallel_compile_restores_the_setting_when_the_block_fails() -> None:
    with inductor_config.patch(compile_threads=1):
        with pytest.raises(RuntimeError, match="boom"), parallel_compile(3) as workers:
            assert workers == 3
            assert inductor_config.compile_threads == 3
            raise RuntimeError("boom")
        assert inductor_config.compile_threads == 1
        with parallel_compile(0) as workers:  # at least one
            assert workers == 1
            assert inductor_config.compile_threads == 1


def test_the_default_is_a_worker_per_core_up_to_inductors_cap() -> None:
    assert 1 <= default_compile_workers() <= 32
