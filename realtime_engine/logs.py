"""Where the engine's own log records go in processes that another program set up.

The engine logs under ``realtime_engine``. vLLM's processes (its engine core and
workers) configure only vLLM's loggers, so without a handler on ``realtime_engine``
its INFO records, such as the float16 codec check's error, would be dropped there.
"""

from __future__ import annotations

import logging

ENGINE_LOGGER = "realtime_engine"


def route_engine_logs(through: str) -> bool:
    """Give the engine's logger the handlers and level of the logger ``through`` (vLLM's
    ``"vllm"``), unless it has handlers already (the gateway's, say). Idempotent; whether
    it routed anything."""
    engine = logging.getLogger(ENGINE_LOGGER)
    source = logging.getLogger(through)
    if engine.handlers or not source.handlers:
        return False
    for handler in source.handlers:
        engine.addHandler(handler)
    if engine.level == logging.NOTSET:
        engine.setLevel(source.getEffectiveLevel())
    return True
