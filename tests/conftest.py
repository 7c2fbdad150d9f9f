"""Shared test fixtures.

``tiny_checkpoint`` is the synthetic Higgs Audio v3 checkpoint (real key
names and layout, tiny sizes, seed 0), built once per test session. The
session also points the model cache at a temporary directory, so
``--model tiny`` inside tests (and in processes they start) resolves to that
same checkpoint and never writes to the user's cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
