"""The ``speech-gateway`` command on an install without the server extra."""

from __future__ import annotations

import sys

import pytest

from gateway import entry


def test_a_missing_server_package_is_a_clear_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # what the base install lacks: uvicorn (and the server modules that import it)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    for module in ("gateway.cli", "gateway.serving", "gateway.workers"):  # so they import anew
        monkeypatch.delitem(sys.modules, module, raising=False)
    assert entry.main() == 2
    err = capsys.readouterr().err
    assert "[server] extra" in err and "uvicorn" in err and entry.SERVER_EXTRA_HINT in err
    assert "Traceback" not in err


def test_with_the_server_installed_the_command_runs_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["speech-gateway", "serve", "--talker", "onnx"])
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses the unknown backend
        entry.main()
    assert exit_info.value.code == 2
