"""The compiled codec's warm-up compiles in parallel even where vLLM pinned Inductor
to one thread, and leaves vLLM's setting and no compile workers behind; the plugin's
compiles cache their code in a folder of their own and leave vLLM's in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from streaming_support import random_tiny_codec
from torch._inductor import async_compile
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from realtime_engine.talker.codec_slots import CodecSlots
from realtime_engine.talker.compile_workers import (
    CACHE_DIR_VARIABLES,
    COMPILE_PHASES,
    compile_phase_seconds,
    default_compile_workers,
    describe_compile_phases,
    own_compile_cache,
    parallel_compile,
)


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


def test_a_warm_ups_compile_phases_are_the_difference_of_two_readings() -> None:
    """The codec's start-up line says where its compile went: the phases grow by
    what one compile between the two readings cost, Dynamo's and Inductor's alike."""
    torch._dynamo.reset()
    before = compile_phase_seconds()
    assert set(before) == set(COMPILE_PHASES)
    with inductor_config.patch(fx_graph_cache=False):
        compiled = torch.compile(lambda x: (x * 2.0).sin() + 1.0, fullgraph=True)
        compiled(torch.randn(8))
    after = compile_phase_seconds()
    spent = {phase: after[phase] - before[phase] for phase in COMPILE_PHASES}
    assert spent["dynamo"] > 0 and spent["inductor"] > 0 and spent["aot"] >= spent["inductor"]
    assert all(seconds >= 0 for seconds in spent.values())
    line = describe_compile_phases(before, after)
    assert line.split(", ")[0] == f"dynamo {spent['dynamo']:.1f} s"
    assert [part.split()[0] for part in line.split(", ")] == list(COMPILE_PHASES)


def test_compile_phases_read_as_zeros_where_torch_keeps_no_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._dynamo.utils as dynamo_utils

    def no_counters(repr: str = "str", aggregate: bool = False) -> None:
        raise AttributeError("no compile counters in this torch")

    monkeypatch.setattr(dynamo_utils, "compile_times", no_counters)
    assert compile_phase_seconds() == dict.fromkeys(COMPILE_PHASES, 0.0)


def test_own_compile_cache_holds_the_code_compiled_inside_and_gives_vllms_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllms = tmp_path / "vllm" / "inductor_cache"  # what vLLM leaves in its engine core
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(vllms))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    own = tmp_path / "plugin"

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 3.0 + 1.0

    torch._dynamo.reset()
    with own_compile_cache(own):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(own / "inductor_cache")
        assert os.environ["TRITON_CACHE_DIR"] == str(own / "triton_cache")
        x = torch.linspace(0, 1, 16)
        torch.testing.assert_close(torch.compile(scaled, fullgraph=True)(x), scaled(x))
    assert [p for p in (own / "inductor_cache" / "fxgraph").rglob("*") if p.is_file()]
    assert not vllms.exists()  # nothing of it went to vLLM's folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(vllms)
    assert "TRITON_CACHE_DIR" not in os.environ  # unset before, unset after


def test_own_compile_cache_restores_the_environment_when_the_block_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/vllm/inductor")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/vllm/triton")
    with pytest.raises(RuntimeError, match="boom"), own_compile_cache(tmp_path):
        raise RuntimeError("boom")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/vllm/inductor"
    assert os.environ["TRITON_CACHE_DIR"] == "/vllm/triton"


def test_own_compile_cache_leaves_vllms_where_its_folder_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/vllm/inductor")
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    before = {name: os.environ.get(name) for name in CACHE_DIR_VARIABLES}
    for root in (blocked / "cache", None):  # unwritable; or no folder of its own wanted
        with own_compile_cache(root):
            assert {name: os.environ.get(name) for name in CACHE_DIR_VARIABLES} == before


def test_a_second_codec_compiles_from_the_first_ones_cached_graph() -> None:
    """A start compiles the same codec in a new process, with every module at a new
    address: the compiled step's inputs must be named the same way, or AOTAutograd's
    cache misses and each start traces the whole step again (RESULTS.md section 42)."""
    from torch._dynamo.utils import counters

    def compile_one() -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        CodecSlots(random_tiny_codec(), 2, kernels="compiled", compile_workers=1).warm_up()
        return dict(counters["aot_autograd"])

    compile_one()  # cached now, if it was not already
    second = compile_one()
    assert second.get("autograd_cache_hit", 0) >= 1, second
    assert "autograd_cache_miss" not in second, second
