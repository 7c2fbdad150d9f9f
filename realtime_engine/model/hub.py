"""Where a model id points: ``tiny``, a local directory, or a Hugging Face repo id (offline).

``tiny`` (or ``tiny-seedN``) is the synthetic checkpoint of
:mod:`realtime_engine.model.tiny`, generated into the cache on first use.
Hugging Face ids resolve only from the local HF cache: serving never
downloads weights.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from realtime_engine.errors import CheckpointError

TINY_PATTERN = re.compile(r"^tiny(?:-seed(\d+))?$")
# Bump when the tiny checkpoint's content changes, so stale caches are not reused.
TINY_FORMAT = "v1"
_COMPLETE_MARKER = ".complete"


class ModelNotFoundError(CheckpointError):
    """A model id names neither a directory nor a repository in the local HF cache."""


def cache_root() -> Path:
    """``$REALTIME_SPEECH_CACHE``, else ``$XDG_CACHE_HOME/realtime-speech-gateway`` (~/.cache)."""
    explicit = os.environ.get("REALTIME_SPEECH_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "realtime-speech-gateway"


def tiny_checkpoint_dir(seed: int = 0, root: Path | None = None) -> Path:
    """The tiny checkpoint for ``seed``, written on first call (safe across processes)."""
    root = root or cache_root()
    target = root / f"tiny-seed{seed}-{TINY_FORMAT}"
    if (target / _COMPLETE_MARKER).is_file():
        return target
    from realtime_engine.model.tiny import write_tiny_checkpoint

    root.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent reader never sees half a checkpoint.
    scratch = Path(tempfile.mkdtemp(prefix=f".tiny-seed{seed}-", dir=root))
    try:
        write_tiny_checkpoint(scratch, seed=seed)
        (scratch / _COMPLETE_MARKER).write_text(TINY_FORMAT, encoding="utf-8")
        try:
            scratch.rename(target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():  # lost a race to a broken writer
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return target


def resolve_model(model: str | Path, *, hf_cache_dir: str | Path | None = None) -> Path:
    """Local directory of ``model``: ``tiny``/``tiny-seedN``, a directory or a cached HF id.

    ``hf_cache_dir`` overrides the Hugging Face cache location (default: HF's own).
    """
    text = str(model)
    match = TINY_PATTERN.match(text)
    if match:
        return tiny_checkpoint_dir(int(match.group(1) or 0))
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelNotFoundError(f"model {text!r} is a file, not a checkpoint directory", key=text)
    if text.count("/") != 1 or text.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model directory {text!r} does not exist", key=text)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=text, local_files_only=True, cache_dir=hf_cache_dir))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError) as e:
        raise ModelNotFoundError(
            f"model {text!r} is not a local directory and is not in the local Hugging Face "
            f"cache; download it first (huggingface-cli download {text}) or pass a directory",
            key=text,
        ) from e
