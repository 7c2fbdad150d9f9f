"""Choosing a talker runner by backend name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from realtime_engine.model.prompts import build_zero_shot_prompt
from realtime_engine.model.tokenizer import HiggsTokenizer
from realtime_engine.talker.reference_runner import ReferenceRunner
from realtime_engine.talker.runner_factory import create_talker_runner
from realtime_engine.talker.types import TalkerRequest, TalkerSampling


def test_unknown_backends_are_rejected(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="backend"):
        create_talker_runner(tiny_checkpoint, backend="onnx")


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks vLLM on a CUDA machine")
async def test_auto_without_a_gpu_gives_a_working_reference_runner(tiny_checkpoint: Path) -> None:
    runner = create_talker_runner(tiny_checkpoint, backend="auto", max_batch=2)
    assert isinstance(runner, ReferenceRunner)
    prompt = build_zero_shot_prompt(HiggsTokenizer.from_dir(tiny_checkpoint), "hello")
    request = TalkerRequest("f", prompt, TalkerSampling(temperature=0.0), fixed_rows=9)
    try:
        rows = [row async for row in runner.submit(request)]
    finally:
        await runner.close()
    assert np.stack(rows).shape == (9, 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks vLLM on a CUDA machine")
async def test_auto_drops_vllm_only_options_when_it_falls_back(tiny_checkpoint: Path) -> None:
    runner = create_talker_runner(
        tiny_checkpoint, backend="auto", max_num_seqs=64, gpu_memory_utilization=0.9
    )
    try:
        assert isinstance(runner, ReferenceRunner)
    finally:
        await runner.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks vLLM on a CUDA machine")
async def test_higgs_engine_auto_backend_uses_the_reference_runner_on_cpu(
    tiny_checkpoint: Path,
) -> None:
    from realtime_engine.engines.higgs import HiggsEngine

    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu")
    try:
        assert isinstance(engine._runner, ReferenceRunner)
    finally:
        await engine.close()
