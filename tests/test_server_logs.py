"""The server's and the engine's log records reach an operator: on standard error at
``serve --log-level`` in the gateway, through vLLM's handlers in vLLM's processes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gateway.logs import SERVER_LOGGERS, configure_server_logs, log_level
from realtime_engine.logs import ENGINE_LOGGER, route_engine_logs


@pytest.fixture
def fresh_loggers() -> Iterator[None]:
    """The server's loggers without handlers or level for the test, as before after."""
    names = (*SERVER_LOGGERS, "vllm_like")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in names}
    for name in names:
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, (handlers, level) in saved.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).setLevel(level)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.usefixtures("fresh_loggers")
def test_the_engines_info_reaches_standard_error_at_the_servers_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_server_logs("info")
    configure_server_logs("info")  # once is enough: no record twice
    logging.getLogger("realtime_engine.codec").info("float16 is %.1e of the peak", 1.6e-3)
    logging.getLogger("gateway.voices").debug("below the level")
    logging.getLogger("gateway").warning("a warning")
    err = capsys.readouterr().err
    assert err.count("realtime_engine.codec: float16 is 1.6e-03 of the peak") == 1
    assert "INFO:" in err and "gateway: a warning" in err
    assert "below the level" not in err
    configure_server_logs("debug")
    logging.getLogger("gateway.voices").debug("now shown")
    assert "now shown" in capsys.readouterr().err


def test_uvicorns_levels_map_to_logging_levels() -> None:
    assert log_level("info") == logging.INFO and log_level("WARNING") == logging.WARNING
    # uvicorn's level below debug: its own number once uvicorn has named it, else DEBUG
    assert log_level("trace") <= logging.DEBUG


@pytest.mark.usefixtures("fresh_loggers")
def test_the_engines_records_go_through_vllms_handlers_where_nothing_else_set_them_up() -> None:
    vllm_like = logging.getLogger("vllm_like")
    collect = Collect()
    vllm_like.addHandler(collect)
    vllm_like.setLevel(logging.INFO)
    assert route_engine_logs("vllm_like") is True
    assert route_engine_logs("vllm_like") is False  # idempotent: one handler
    logging.getLogger("realtime_engine.codec").info("float16 is fine")
    logging.getLogger("realtime_engine.codec").debug("not at vLLM's level")
    assert collect.messages == ["float16 is fine"]


@pytest.mark.usefixtures("fresh_loggers")
def test_the_gateways_handler_is_kept_when_vllm_loads_in_its_process() -> None:
    configure_server_logs("info")
    vllm_like = logging.getLogger("vllm_like")
    vllm_like.addHandler(Collect())
    assert route_engine_logs("vllm_like") is False
    assert len(logging.getLogger(ENGINE_LOGGER).handlers) == 1
