"""Shared test fixtures.

``tiny_checkpoint`` is the synthetic Higgs Audio v3 checkpoint (real key
names and layout, tiny sizes, seed 0), built once per test session. The
session also points the model cache at a temporary directory, so
``--model tiny`` inside tests (and in processes they start) resolves to that
same checkpoint and never writes to the user's cache.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import WebSocketTestSession

from realtime_engine.model.hub import tiny_checkpoint_dir


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("model-cache")
    previous = os.environ.get("REALTIME_SPEECH_CACHE")
    os.environ["REALTIME_SPEECH_CACHE"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("REALTIME_SPEECH_CACHE", None)
    else:
        os.environ["REALTIME_SPEECH_CACHE"] = previous


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the codec tests: steadier timing on a small machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def few_interpreted_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fused kernels launched as one program per slot and step, up to 1024 samples.

    Triton's interpreter runs each program of a launch in Python, so an interpreted
    test's time goes with its program count (a streaming codec's test: about 8x
    less). For the tests of what a stream carries from step to step (histories,
    start masks, slots); each kernel's own tests cover its tile edges at the real
    launches."""
    from realtime_engine.codec import fused_output, fused_unit, fused_upsample

    wide = 1024
    monkeypatch.setattr(fused_unit, "unit_launch", lambda padded, activate: (wide, 4))
    monkeypatch.setattr(
        fused_upsample,
        "upsample_tile",
        lambda out_block, inputs: max(fused_upsample.MIN_DOT, min(wide, 1 << inputs.bit_length())),
    )
    monkeypatch.setattr(fused_output, "output_tile", lambda channels: wide)


@pytest.fixture(scope="session")
def tiny_checkpoint(_model_cache: Path) -> Path:
    """Directory of the tiny checkpoint (config.json, model.safetensors, tokenizer files).

    Read-only: copy it before changing anything.
    """
    return tiny_checkpoint_dir(0, root=_model_cache)


@pytest.fixture(scope="session")
def tiny_sharded_checkpoint(
    tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The same checkpoint split into three shards with ``model.safetensors.index.json``."""
    from realtime_engine.model.tiny import write_sharded_copy

    return write_sharded_copy(tiny_checkpoint, tmp_path_factory.mktemp("tiny-sharded"))


_websocket_exit = WebSocketTestSession.__exit__


def _websocket_exit_after_the_test(self: WebSocketTestSession, *exc_info: Any) -> Any:
    """Starlette's test client closes a WebSocket, then cancels the app's task and
    reads its result. On a loaded machine the server may still be in its session
    cleanup (aborting engine requests) at that moment, and the cancellation can
    surface here as ``CancelledError`` after every assertion of the test has run.
    That is the harness tearing down, not the gateway (uvicorn never cancels a
    handler like this): it is let pass; any error of the test itself still does."""
    try:
        return _websocket_exit(self, *exc_info)
    except concurrent.futures.CancelledError:
        return None


WebSocketTestSession.__exit__ = _websocket_exit_after_the_test  # type: ignore[method-assign]


# -- shared by the streaming-codec tests -----------------------------------------


@pytest.fixture(scope="module")
def tiny_codec() -> Any:
    """The tiny codec's decoder, random weights (seed 0), float32."""
    from streaming_support import random_tiny_codec

    return random_tiny_codec()


@pytest.fixture(scope="module")
def codec64(tiny_codec: Any) -> Any:
    """The same codec in float64: exactness is asserted without float32 rounding."""
    import copy

    return copy.deepcopy(tiny_codec).double()


@pytest.fixture(scope="module")
def core(codec64: Any) -> Any:
    """One shared streaming codec: every decoder takes (and gives back) a slot of it."""
    from realtime_engine.codec.stream_core import StreamingCodec

    return StreamingCodec(codec64, max_slots=4)


# -- shared by the Higgs engine tests --------------------------------------------


@pytest.fixture(scope="module")
def tiny_talker(tiny_checkpoint: Path) -> Any:
    """The tiny checkpoint loaded for the reference talker (model, codec, tokenizer)."""
    from realtime_engine.model.loader import load_talker

    return load_talker(tiny_checkpoint)


@pytest.fixture(scope="module")
def checkpoint_codec(tiny_talker: Any) -> Any:
    """The tiny checkpoint's bundled codec (the offline decode tests compare with)."""
    assert tiny_talker.codec is not None
    return tiny_talker.codec


@pytest.fixture
def reference_engine(tiny_talker: Any) -> Iterator[Any]:
    """A Higgs engine on the reference talker with its codec beside it."""
    import asyncio

    from realtime_engine.engines.higgs import HiggsEngine
    from realtime_engine.talker.reference_runner import ReferenceRunner

    assert tiny_talker.codec is not None
    runner = ReferenceRunner(tiny_talker.model, codec=tiny_talker.codec)
    engine = HiggsEngine(runner, tiny_talker.tokenizer)
    yield engine
    asyncio.run(engine.close())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``TESTS_NO_SKIPS=1`` (the CI run, which installs every optional
    dependency) a skipped test fails: a skip there means an install step went
    missing, not that the machine lacks an optional tool."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("TESTS_NO_SKIPS") == "1":
        report.outcome = "failed"
        report.longrepr = (
            f"skipped, but TESTS_NO_SKIPS=1 requires every test to run: {report.longrepr}"
        )
