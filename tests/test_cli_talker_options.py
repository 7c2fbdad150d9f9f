"""``speech-gateway serve --talker-options``: vLLM engine options from the command line."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import cli
from realtime_engine.codec.decoder import CODEC_PRECISIONS
from realtime_engine.engines.higgs import HiggsEngine


def test_talker_options_reach_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model: str, device: str | None, **kwargs: Any) -> object:
        seen.update(model=model, **kwargs)
        return object()

    monkeypatch.setattr(HiggsEngine, "from_pretrained", staticmethod(fake_from_pretrained))
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--model",
            "/ckpt",
            "--talker",
            "vllm",
            "--talker-options",
            '{"max_num_seqs": 256}',
        ]
    )
    cli.build_engine("higgs", args.model, args.device, args.talker, args.talker_options)
    assert seen == {
        "model": "/ckpt",
        "backend": "vllm",
        "runner_options": {"max_num_seqs": 256},
        "codec_precision": "fp32",
        "codec_batch": 64,
    }
    assert cli.build_parser().parse_args(["serve"]).talker_options is None


def test_codec_options_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model: str, device: str | None, **kwargs: Any) -> object:
        seen.update(kwargs)
        return object()

    monkeypatch.setattr(HiggsEngine, "from_pretrained", staticmethod(fake_from_pretrained))
    argv = ["serve", "--model", "/ckpt", "--codec-precision", "tf32", "--codec-batch", "32"]
    args = cli.build_parser().parse_args(argv)
    cli.build_engine(
        "higgs", args.model, None, "auto", None, args.codec_precision, args.codec_batch
    )
    assert (seen["codec_precision"], seen["codec_batch"]) == ("tf32", 32)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--codec-precision", "fp8"])


def test_cli_precisions_are_the_codec_precisions() -> None:
    assert cli.CODEC_PRECISIONS == CODEC_PRECISIONS


@pytest.mark.parametrize("bad", ["[1, 2]", "{not json"])
def test_talker_options_must_be_a_json_object(bad: str) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--talker-options", bad])
