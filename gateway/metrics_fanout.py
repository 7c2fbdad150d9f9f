"""``/metrics`` for the whole server: every worker's own metrics, read and merged.

Each worker process also listens on a private Unix socket
(``settings.worker_sockets[i]``), where ``GET /metrics?scope=worker`` answers
for that worker alone. The worker a scrape reaches reads the others' there,
concurrently and each within :data:`PEER_TIMEOUT_S`, and merges them with its
own (:mod:`gateway.metrics_merge`). A worker that does not answer in time is
left out and counted in ``speech_gateway_workers_unreachable``; nothing here
raises, so a scrape never fails because of another process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import httpx

from gateway.metrics_merge import merge_expositions

log = logging.getLogger("gateway.metrics")

# How long one worker's own metrics may take (connect and answer) before it is left out.
PEER_TIMEOUT_S = 1.0

SCOPE_PARAM = "scope"
WORKER_SCOPE = "worker"


async def fetch_worker_metrics(socket_path: str, timeout_s: float | None = None) -> str | None:
    """One worker's own exposition, read over its Unix socket; None when it does not answer."""
    timeout = PEER_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        async with asyncio.timeout(timeout):
            transport = httpx.AsyncHTTPTransport(uds=socket_path)
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                response = await client.get(
                    "http://worker/metrics", params={SCOPE_PARAM: WORKER_SCOPE}
                )
    except Exception as e:  # refused, missing, too slow, cut off: all the same to a scrape
        log.warning("worker metrics at %s not read: %s", socket_path, type(e).__name__)
        return None
    if response.status_code != 200:
        log.warning("worker metrics at %s answered %d", socket_path, response.status_code)
        return None
    return response.text


async def server_metrics(
    own: bytes, worker_index: int, worker_sockets: Sequence[str], shared_engine: bool = True
) -> bytes:
    """This worker's ``own`` exposition merged with every other worker's
    (``shared_engine``: see :func:`~gateway.metrics_merge.merge_expositions`)."""
    count = max(len(worker_sockets), worker_index + 1)
    peers = [i for i in range(len(worker_sockets)) if i != worker_index]
    answers = await asyncio.gather(*(fetch_worker_metrics(worker_sockets[i]) for i in peers))
    texts: list[str | None] = [None] * count
    texts[worker_index] = own.decode()
    for index, text in zip(peers, answers, strict=True):
        texts[index] = text
    try:
        return merge_expositions(texts, shared_engine=shared_engine)
    except Exception:
        log.exception("worker metrics not merged; this worker's own answered instead")
        return own
