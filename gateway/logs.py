"""The server's own logs on standard error at ``serve --log-level``.

uvicorn configures only its own loggers: without this, the gateway's and the
engine's INFO records (what the engine loaded, how its codec checked out)
would be dropped, and their warnings would reach standard error unformatted.
"""

from __future__ import annotations

import logging
import sys

SERVER_LOGGERS = ("gateway", "realtime_engine")
LOG_FORMAT = "%(levelname)s:  %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (so a replaced
    stream, as under a test runner, is never written to after it closed)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def log_level(name: str) -> int:
    """``--log-level`` as a number; uvicorn's ``trace`` (below ``debug``) is ``DEBUG``
    until uvicorn has named its level."""
    level = logging.getLevelName(name.upper())
    return level if isinstance(level, int) else logging.DEBUG


def configure_server_logs(level: str) -> None:
    """Set the server's loggers to ``level`` and give each one handler on standard
    error, unless it has a handler already. Idempotent."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(log_level(level))
        if not logger.handlers:
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            logger.addHandler(handler)
