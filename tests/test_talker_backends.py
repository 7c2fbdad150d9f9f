"""Choosing the talker runner: the backend resolved once, its typed options applied."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.talker.backends import (
    ReferenceOptions,
    TalkerOptionsError,
    VllmOptions,
    parse_talker_options,
    resolve_backend,
    talker_options,
)
from realtime_engine.talker.reference_runner import ReferenceRunner


def vllm_options(raw: dict[str, Any]) -> VllmOptions:
    options = parse_talker_options("vllm", raw)
    assert isinstance(options, VllmOptions)
    return options


def test_unknown_backends_and_keys_are_named() -> None:
    with pytest.raises(TalkerOptionsError, match=r"'onnx'.*auto, vllm, reference"):
        resolve_backend("onnx")
    with pytest.raises(TalkerOptionsError) as info:
        parse_talker_options("vllm", {"max_batch": 2})
    assert "'max_batch'" in str(info.value) and "gpu_memory_utilization" in str(info.value)
    assert vllm_options({"engine_args": {"seed": 1}}).engine_args == {"seed": 1}
    assert parse_talker_options("reference", None) == ReferenceOptions()


def test_resolving_auto_imports_neither_vllm_nor_zmq() -> None:
    code = (
        "import sys; from realtime_engine.talker.backends import resolve_backend; "
        "resolve_backend('auto'); "
        "sys.exit(1 if {'vllm', 'zmq'} & {m.split('.')[0] for m in sys.modules} else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks vLLM on a CUDA machine")
async def test_auto_without_a_gpu_gives_a_working_reference_runner(tiny_checkpoint: Path) -> None:
    talker = talker_options("auto", {"max_batch": 2, "queue_rows": 16})
    assert talker == ReferenceOptions(max_batch=2, queue_rows=16)
    engine = HiggsEngine.from_pretrained(str(tiny_checkpoint), "cpu", talker=talker)
    try:
        runner = engine._runner
        assert isinstance(runner, ReferenceRunner)
        assert (runner.max_batch, runner.queue_rows) == (2, 16)
        from realtime_engine.engines.base import SegmentRequest

        chunks = [c async for c in engine.synthesize(SegmentRequest("f", "hello", fixed_rows=3))]
        assert sum(c.size for c in chunks) == 3 * 960
        assert np.isfinite(np.concatenate(chunks)).all()
    finally:
        await engine.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks vLLM on a CUDA machine")
def test_vllm_options_do_not_fall_back_silently() -> None:
    with pytest.raises(TalkerOptionsError, match="auto chose reference"):
        talker_options("auto", {"max_num_seqs": 64, "gpu_memory_utilization": 0.9})
    assert isinstance(talker_options("vllm", {"max_num_seqs": 64}), VllmOptions)


def test_fp8_weights_and_the_sampler_switch_reach_the_engine_arguments() -> None:
    """The documented options (docs/vllm-talker.md) travel through ``engine_args``
    into vLLM's engine arguments, next to the codec settings the runner adds."""
    from realtime_engine.talker.vllm_engine_config import talker_engine_args
    from realtime_engine.talker.vllm_protocol import CODEC_CONFIG_KEY, SAMPLER_CONFIG_KEY

    options = vllm_options(
        {
            "engine_args": {
                "quantization": "fp8",
                "additional_config": {SAMPLER_CONFIG_KEY: {"compiled": False}},
            }
        },
    )
    args = talker_engine_args(
        "/m", enforce_eager=True, codec_precision="tf32", codec_batch=64, **options.engine_args
    )
    assert args["quantization"] == "fp8"
    assert args["additional_config"][SAMPLER_CONFIG_KEY] == {"compiled": False}
    assert args["additional_config"][CODEC_CONFIG_KEY]["precision"] == "tf32"


def test_codec_options_in_the_talker_options_win_over_the_flags() -> None:
    """A codec option with no flag of its own (the codec streams' CUDA priority)
    reaches the engine core through the talker options' additional_config, and
    one given there overrides the flag's value; the rest keep the flags'."""
    from realtime_engine.format import DEFAULT_CODEC_KERNELS
    from realtime_engine.talker.vllm_engine_config import talker_engine_args
    from realtime_engine.talker.vllm_protocol import CODEC_CONFIG_KEY

    options = vllm_options(
        {
            "engine_args": {
                "additional_config": {
                    CODEC_CONFIG_KEY: {"stream_priority": "normal", "max_batch": 32}
                }
            }
        },
    )
    args = talker_engine_args(
        "/m", enforce_eager=True, codec_precision="tf32", codec_batch=64, **options.engine_args
    )
    assert args["additional_config"][CODEC_CONFIG_KEY] == {
        "precision": "tf32",
        "max_batch": 32,
        "kernels": DEFAULT_CODEC_KERNELS,
        "stream_priority": "normal",
    }
    with pytest.raises(ValueError, match="must be an object"):
        talker_engine_args(
            "/m",
            enforce_eager=True,
            codec_precision="tf32",
            codec_batch=64,
            additional_config={CODEC_CONFIG_KEY: "normal"},
        )


def test_the_sampler_is_compiled_unless_the_engine_config_says_not() -> None:
    from types import SimpleNamespace

    from realtime_engine.talker.vllm_protocol import SAMPLER_CONFIG_KEY
    from realtime_engine.talker.vllm_state import sampler_compiled

    def config(extra: object) -> Any:
        return SimpleNamespace(additional_config=extra)

    assert sampler_compiled(config({}))
    assert sampler_compiled(config(None))
    assert sampler_compiled(config({SAMPLER_CONFIG_KEY: {"compiled": True}}))
    assert not sampler_compiled(config({SAMPLER_CONFIG_KEY: {"compiled": False}}))
    with pytest.raises(ValueError, match="must be true or false"):
        sampler_compiled(config({SAMPLER_CONFIG_KEY: {"compiled": "false"}}))


def test_the_switch_interval_is_pythons_unless_a_number_in_range_is_given() -> None:
    from realtime_engine.talker.vllm_state import switch_interval_option

    assert switch_interval_option({}) is None
    assert switch_interval_option({"switch_interval_ms": None}) is None
    assert switch_interval_option({"switch_interval_ms": 0.5}) == 0.5
    assert switch_interval_option({"switch_interval_ms": 2}) == 2.0
    for bad in (0, 0.01, 101, True, "0.5", [1]):
        with pytest.raises(ValueError, match="switch_interval_ms"):
            switch_interval_option({"switch_interval_ms": bad})


def test_the_codec_chooses_its_matrix_products_unless_the_options_say() -> None:
    from realtime_engine.talker.vllm_state import gemm_channels_option

    assert gemm_channels_option({}) == "auto"
    assert gemm_channels_option({"gemm_channels": None}) == "auto"
    assert gemm_channels_option({"gemm_channels": "auto"}) == "auto"
    assert gemm_channels_option({"gemm_channels": 0}) is None
    assert gemm_channels_option({"gemm_channels": 256}) == 256
    for bad in (-1, 2.5, True, False, "256", "none", [256]):
        with pytest.raises(ValueError, match="gemm_channels"):
            gemm_channels_option({"gemm_channels": bad})


def test_the_products_shift_their_taps_unless_the_codec_options_say_gathered() -> None:
    from realtime_engine.talker.vllm_state import gemm_taps_option

    assert gemm_taps_option({}) == "shifted"
    assert gemm_taps_option({"gemm_taps": "gathered"}) == "gathered"
    assert gemm_taps_option({"gemm_taps": "shifted"}) == "shifted"
    for bad in (None, True, "shift", 1, ["shifted"]):
        with pytest.raises(ValueError, match="gemm_taps"):
            gemm_taps_option({"gemm_taps": bad})


def test_the_fused_units_go_by_the_device_unless_the_codec_options_say() -> None:
    from realtime_engine.talker.vllm_state import fused_units_option

    assert fused_units_option({}) == "auto"
    assert fused_units_option({"fused_units": "auto"}) == "auto"
    assert fused_units_option({"fused_units": False}) is False
    assert fused_units_option({"fused_units": True}) is True
    assert fused_units_option({"fused_units": "activation"}) == "activation"
    assert fused_units_option({"fused_units": "narrow"}) == "narrow"
    for bad in (1, 0, "true", None, "all"):
        with pytest.raises(ValueError, match="fused_units"):
            fused_units_option({"fused_units": bad})


def test_the_decode_thread_is_off_unless_the_codec_options_say_true() -> None:
    from realtime_engine.talker.vllm_state import decode_thread_option

    assert not decode_thread_option({})
    assert decode_thread_option({"decode_thread": True})
    assert not decode_thread_option({"decode_thread": False})
    with pytest.raises(ValueError, match="must be true or false"):
        decode_thread_option({"decode_thread": "yes"})


def test_the_engine_runs_without_cublas_workspaces_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Captured graphs must not hold a workspace PyTorch can free under them: the
    engine processes inherit a zero workspace, which a user's own setting overrides."""
    from realtime_engine.talker.vllm_engine_config import talker_engine_args

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "1024")
    talker_engine_args("/m", enforce_eager=True, codec_precision="tf32", codec_batch=64)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "1024"
