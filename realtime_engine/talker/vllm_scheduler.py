"""vLLM's scheduler with playback pacing (runs in the engine core).

The talker names :func:`paced_scheduler` as vLLM's ``scheduler_cls``; it
builds vLLM's own scheduler, the asynchronous one when asynchronous
scheduling is on, with one change: before each step, the running requests
that :func:`~realtime_engine.talker.pacing.streams_to_hold` picks are taken
out of the running list for that step's scheduling and put back after. A
request left out of a step keeps its KV cache and its slot, exactly like a
running request vLLM itself leaves out when the step's token budget runs
out; it simply decodes one step later. The pacing settings come from the
engine's ``additional_config`` (:data:`PACING_CONFIG_KEY`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from realtime_engine.talker.pacing import PacingPolicy, streams_to_hold, unsent_frames_bound
from realtime_engine.talker.vllm_protocol import PACING_CONFIG_KEY, TalkerArgs, TalkerArgsError

logger = logging.getLogger(__name__)


def _unsent_frames(request: Any) -> int | None:
    """:func:`unsent_frames_bound` of an audio request's chunking; None for a
    request that asks for rows (or that the talker will refuse)."""
    params = getattr(request, "sampling_params", None)
    try:
        args = TalkerArgs.from_extra_args(params.extra_args if params is not None else None)
    except TalkerArgsError:
        return None
    if args is None or args.chunking is None:
        return None
    return unsent_frames_bound(args.chunking_params())


class _Pacing:
    """The pacing half of a paced scheduler (mixed in before vLLM's class)."""

    running: list[Any]
    requests: dict[str, Any]
    max_num_running_reqs: int
    vllm_config: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = getattr(self.vllm_config, "additional_config", None) or {}
        self.pacing = PacingPolicy.from_config(config.get(PACING_CONFIG_KEY))
        # request id -> (its first row's time, its unsent-frames bound or None: rows)
        self._seen: dict[str, tuple[float, int | None]] = {}
        self.held_steps = 0  # request-steps left out so far
        self.clock: Callable[[], float] = time.monotonic
        logger.info(
            "playback pacing: past %d running, audio streams with %.1f s or more sent ahead"
            " of playback sit out a step, the most ahead first (%s scheduling)",
            self.pacing.max_decode_batch,
            self.pacing.min_buffer_s,
            "asynchronous" if isinstance(self, AsyncScheduler) else "synchronous",
        )

    def _held(self) -> list[Any]:
        if not self.pacing.active:
            return []
        now = self.clock()
        seen = self._seen
        for request in self.running:  # note each request's first row
            if request.request_id not in seen and request.num_output_tokens > 0:
                seen[request.request_id] = (now, _unsent_frames(request))
        if len(seen) > 2 * len(self.requests) + 64:
            # Forget finished requests only: a preempted one keeps its first row's
            # time, or its listener's buffer would look as full as its rows.
            live = self.requests
            self._seen = seen = {rid: first for rid, first in seen.items() if rid in live}
        if len(self.running) <= self.pacing.max_decode_batch:
            return []
        not_yet = (None, None)
        streams = [
            (request.num_output_tokens, *seen.get(request.request_id, not_yet))
            for request in self.running
        ]
        return [self.running[i] for i in streams_to_hold(self.pacing, streams, now)]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        schedule = super().schedule  # type: ignore[misc]  # vLLM's, next in the MRO
        held = self._held()
        if not held:
            return schedule(*args, **kwargs)
        left_out = {id(request) for request in held}
        self.running = [request for request in self.running if id(request) not in left_out]
        # Held requests keep their model-runner slots: admit no more than before.
        self.max_num_running_reqs -= len(held)
        try:
            return schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs += len(held)
            # Behind the rest: under KV pressure vLLM preempts from the end, and
            # these have the most audio buffered.
            self.running.extend(held)
            self.held_steps += len(held)


class PacedScheduler(_Pacing, Scheduler):
    """vLLM's scheduler, paced."""


class PacedAsyncScheduler(_Pacing, AsyncScheduler):
    """vLLM's asynchronous scheduler, paced."""


def paced_scheduler(*args: Any, vllm_config: Any, **kwargs: Any) -> Scheduler:
    """vLLM's scheduler for this configuration, paced (vLLM decides whether
    scheduling is asynchronous after the engine arguments are read)."""
    paced = PacedAsyncScheduler if vllm_config.scheduler_config.async_scheduling else PacedScheduler
    return paced(*args, vllm_config=vllm_config, **kwargs)
