"""``speech-gateway serve --talker --talker-options``: typed options per talker backend."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import cli
from realtime_engine.codec.decoder import CODEC_PRECISIONS
from realtime_engine.engines.higgs import HiggsEngine
from realtime_engine.format import DEFAULT_CODEC_KERNELS, DEFAULT_CODEC_PRECISION
from realtime_engine.talker import backends
from realtime_engine.talker.backends import ReferenceOptions, VllmOptions


def _options(argv: list[str]) -> object:
    args = cli.build_parser().parse_args(["serve", *argv])
    kind = cli.resolve_engine_kind(args.engine, args.model)
    return cli.engine_talker_options(kind, args.talker, args.talker_options)


def test_vllm_options_are_typed_and_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model: str, device: str | None, **kwargs: Any) -> object:
        seen.update(model=model, **kwargs)
        return object()

    monkeypatch.setattr(HiggsEngine, "from_pretrained", staticmethod(fake_from_pretrained))
    argv = ["--model", "/ckpt", "--talker", "vllm", "--talker-options", '{"max_num_seqs": 256}']
    talker = _options(argv)
    assert talker == VllmOptions(max_num_seqs=256)
    assert isinstance(talker, VllmOptions)
    cli.build_engine("higgs", "/ckpt", None, talker)
    assert seen == {
        "model": "/ckpt",
        "talker": VllmOptions(max_num_seqs=256),
        "codec_precision": DEFAULT_CODEC_PRECISION,
        "codec_batch": 64,
        "codec_kernels": DEFAULT_CODEC_KERNELS,
        "talker_host": None,  # the engine is started here
    }
    # A worker of serve --workers: the engine is the talker host's.
    cli.build_engine("higgs", "/ckpt", None, talker, talker_host="ipc:///run/talker")
    assert seen["talker_host"] == "ipc:///run/talker"


def test_reference_options_are_checked_not_dropped() -> None:
    reference = ["--model", "tiny", "--talker", "reference", "--talker-options"]
    talker = _options([*reference, '{"max_batch": 4}'])
    assert talker == ReferenceOptions(max_batch=4)
    with pytest.raises(SystemExit) as info:
        _options([*reference, '{"max_num_seqs": 8}'])
    message = str(info.value)
    assert "'max_num_seqs'" in message and "max_batch" in message and "queue_rows" in message


def test_auto_resolves_once_and_checks_against_the_backend_it_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backends, "vllm_usable", lambda: False)
    assert _options(["--model", "tiny"]) == ReferenceOptions()
    with pytest.raises(SystemExit, match="auto chose reference"):
        _options(["--model", "tiny", "--talker-options", '{"max_num_seqs": 8}'])
    monkeypatch.setattr(backends, "vllm_usable", lambda: True)
    assert _options(["--model", "tiny", "--talker-options", '{"max_num_seqs": 8}']) == (
        VllmOptions(max_num_seqs=8)
    )


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ('{"max_batch": 0}', "max_batch"),
        ('{"max_batch": "many"}', "max_batch"),
        ('{"queue_rows": -1}', "queue_rows"),
    ],
)
def test_bad_values_name_the_option(raw: str, fragment: str) -> None:
    with pytest.raises(SystemExit, match=fragment):
        _options(["--model", "tiny", "--talker", "reference", "--talker-options", raw])


def test_options_for_an_engine_without_a_talker_are_refused() -> None:
    with pytest.raises(SystemExit, match="engine higgs only"):
        _options(["--engine", "fake", "--talker-options", '{"max_batch": 2}'])
    assert _options(["--engine", "fake"]) is None


def test_the_cli_offers_the_backends_module_choices() -> None:
    assert cli.TALKER_BACKENDS is backends.TALKER_BACKENDS
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--talker", "onnx"])
    with pytest.raises(backends.TalkerOptionsError, match="onnx"):
        backends.resolve_backend("onnx")


def test_codec_options_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model: str, device: str | None, **kwargs: Any) -> object:
        seen.update(kwargs)
        return object()

    monkeypatch.setattr(HiggsEngine, "from_pretrained", staticmethod(fake_from_pretrained))
    argv = ["serve", "--model", "/ckpt", "--codec-precision", "tf32", "--codec-batch", "32"]
    args = cli.build_parser().parse_args([*argv, "--codec-kernels", "compiled"])
    cli.build_engine(
        "higgs",
        args.model,
        None,
        None,
        args.codec_precision,
        args.codec_batch,
        args.codec_kernels,
    )
    assert (seen["codec_precision"], seen["codec_batch"]) == ("tf32", 32)
    assert seen["codec_kernels"] == "compiled"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--codec-precision", "fp8"])


def test_cli_precisions_are_the_codec_precisions() -> None:
    assert cli.CODEC_PRECISIONS == CODEC_PRECISIONS


@pytest.mark.parametrize("bad", ["[1, 2]", "{not json"])
def test_talker_options_must_be_a_json_object(bad: str) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--talker-options", bad])
