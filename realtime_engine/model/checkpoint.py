"""Strict reading of the talker checkpoint (one safetensors file or a sharded index).

The layout is checked key by key: a missing required tensor, an unknown key
or a wrong shape raises the typed errors of :mod:`realtime_engine.errors`
naming the key. Keys under :data:`CODEC_PREFIX` belong to the bundled codec
and are checked by the codec loader instead.

:class:`TalkerKeyChecker` works on a stream of ``(name, shape)`` so a serving
backend that consumes weights one by one can enforce the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from realtime_engine.codec.layout import CODEC_PREFIX
from realtime_engine.errors import (
    CheckpointError,
    MissingKeyError,
    ShapeMismatchError,
    UnexpectedKeyError,
)
from realtime_engine.model.config import HiggsTalkerConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

TEXT_EMBEDDING_KEY = "tied.embedding.text_embedding.weight"
AUDIO_EMBEDDING_KEY = "tied.embedding.modality_embeddings.0.embedding.weight"
TEXT_HEAD_KEY = "tied.head.text_head.weight"
AUDIO_HEAD_KEY = "tied.head.modality_heads.0.weight"
BODY_PREFIX = "body."

LAYER_SUFFIXES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)

Shape = tuple[int, ...]


def layer_shapes(config: HiggsTalkerConfig) -> dict[str, Shape]:
    """Shape of each per-layer tensor, by suffix after ``body.layers.N.``."""
    d, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    return {
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (config.q_size, d),
        "self_attn.k_proj.weight": (config.kv_size, d),
        "self_attn.v_proj.weight": (config.kv_size, d),
        "self_attn.o_proj.weight": (d, config.q_size),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (i, d),
        "mlp.up_proj.weight": (i, d),
        "mlp.down_proj.weight": (d, i),
    }


def expected_talker_shapes(config: HiggsTalkerConfig) -> dict[str, Shape]:
    """Every REQUIRED talker tensor (checkpoint names) with its shape; codec keys excluded."""
    d = config.hidden_size
    shapes: dict[str, Shape] = {
        TEXT_EMBEDDING_KEY: (config.vocab_size, d),
        AUDIO_EMBEDDING_KEY: (config.audio_rows, d),
        "body.norm.weight": (d,),
    }
    per_layer = layer_shapes(config)
    for n in range(config.num_hidden_layers):
        for suffix in LAYER_SUFFIXES:
            shapes[f"body.layers.{n}.{suffix}"] = per_layer[suffix]
    if not config.tie_audio_head:
        shapes[AUDIO_HEAD_KEY] = (config.audio_rows, d)
    return shapes


def optional_talker_shapes(config: HiggsTalkerConfig) -> dict[str, Shape]:
    """Tensors accepted when present and never used: the text head, the tied audio head copy."""
    shapes: dict[str, Shape] = {TEXT_HEAD_KEY: (config.vocab_size, config.hidden_size)}
    if config.tie_audio_head:
        shapes[AUDIO_HEAD_KEY] = (config.audio_rows, config.hidden_size)
    return shapes


def talker_param_name(key: str, config: HiggsTalkerConfig) -> str | None:
    """The :class:`HiggsTalker` parameter a checkpoint key loads into; None if it is not loaded."""
    if key == TEXT_EMBEDDING_KEY:
        return "text_embedding.weight"
    if key == AUDIO_EMBEDDING_KEY:
        return "audio_embedding.weight"
    if key == AUDIO_HEAD_KEY and not config.tie_audio_head:
        return "audio_head.weight"
    if key.startswith(BODY_PREFIX):
        return key
    return None


def is_codec_key(key: str) -> bool:
    return key.startswith(CODEC_PREFIX)


class TalkerKeyChecker:
    """Checks a stream of ``(name, shape)`` against the talker layout.

    ``see`` raises at once on an unknown key or a wrong shape; ``finish``
    raises for the first missing required key. Codec keys are passed over.
    """

    def __init__(self, config: HiggsTalkerConfig) -> None:
        self._required = expected_talker_shapes(config)
        self._optional = optional_talker_shapes(config)
        self._seen: set[str] = set()

    def see(self, name: str, shape: Sequence[int]) -> None:
        if is_codec_key(name):
            return
        expected = self._required.get(name) or self._optional.get(name)
        if expected is None:
            raise UnexpectedKeyError(f"checkpoint has an unexpected tensor {name!r}", key=name)
        if tuple(shape) != expected:
            raise ShapeMismatchError(
                f"tensor {name!r} has shape {tuple(shape)}, expected {expected}", key=name
            )
        if name in self._seen:
            raise CheckpointError(f"tensor {name!r} appears twice", key=name)
        self._seen.add(name)

    def finish(self) -> None:
        missing = [k for k in self._required if k not in self._seen]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise MissingKeyError(
                f"checkpoint lacks the required tensor {missing[0]!r}{more}", key=missing[0]
            )


def validate_talker_shapes(shapes: Mapping[str, Sequence[int]], config: HiggsTalkerConfig) -> None:
    """Raise the typed error for the first problem in a name → shape mapping."""
    checker = TalkerKeyChecker(config)
    for name, shape in shapes.items():
        checker.see(name, shape)
    checker.finish()


class SafetensorsCheckpoint(Mapping[str, torch.Tensor]):
    """Lazy read-only view of a checkpoint directory: tensors are read on access.

    Accepts ``model.safetensors`` or ``model.safetensors.index.json`` (whose
    ``weight_map`` must name existing shards that really hold each key).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._file_of: dict[str, Path] = {}
        self._shapes: dict[str, Shape] = {}
        index = self.directory / INDEX_FILE
        single = self.directory / SINGLE_FILE
        if index.is_file():
            self._read_index(index)
        elif single.is_file():
            self._scan(single, None)
        else:
            raise MissingKeyError(
                f"{self.directory} has neither {SINGLE_FILE} nor {INDEX_FILE}", key=SINGLE_FILE
            )

    def _read_index(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a safetensors index: {e}", key=INDEX_FILE) from e
        by_file: dict[str, set[str]] = {}
        for key, filename in weight_map.items():
            by_file.setdefault(filename, set()).add(key)
        for filename in sorted(by_file):
            if not (self.directory / filename).is_file():
                raise MissingKeyError(
                    f"shard {filename!r} named in {INDEX_FILE} is missing", key=filename
                )
        for filename, keys in sorted(by_file.items()):
            self._scan(self.directory / filename, keys)

    def _scan(self, path: Path, listed: set[str] | None) -> None:
        with safe_open(path, framework="pt") as f:
            present = set(f.keys())
            for key in present:
                if listed is not None and key not in listed:
                    raise UnexpectedKeyError(
                        f"tensor {key!r} in {path.name} is not listed in {INDEX_FILE}", key=key
                    )
                if key in self._file_of:
                    raise CheckpointError(f"tensor {key!r} appears in two files", key=key)
                self._file_of[key] = path
                self._shapes[key] = tuple(f.get_slice(key).get_shape())
        for key in sorted((listed or set()) - present):
            raise MissingKeyError(f"tensor {key!r} is listed for {path.name} but absent", key=key)

    def shapes(self) -> dict[str, Shape]:
        return dict(self._shapes)

    def __getitem__(self, key: str) -> torch.Tensor:
        path = self._file_of[key]
        with safe_open(path, framework="pt") as f:
            return f.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)

    def iter_tensors(self, keys: Iterable[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Tensors of ``keys``, opening each file once (file by file, keys sorted)."""
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            by_file.setdefault(self._file_of[key], []).append(key)
        for path in sorted(by_file):
            with safe_open(path, framework="pt") as f:
                for key in sorted(by_file[path]):
                    yield key, f.get_tensor(key)


class CodecView(Mapping[str, torch.Tensor]):
    """The codec tensors of a checkpoint with :data:`CODEC_PREFIX` stripped, read lazily."""

    def __init__(self, checkpoint: Mapping[str, torch.Tensor]) -> None:
        self._checkpoint = checkpoint
        self._keys = [k[len(CODEC_PREFIX) :] for k in checkpoint if is_codec_key(k)]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._checkpoint[CODEC_PREFIX + key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (CODEC_PREFIX + key) in self._checkpoint

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
