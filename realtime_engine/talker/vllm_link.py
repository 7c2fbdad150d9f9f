"""What the talker runner asks of vLLM, and the link that asks it in this process.

:class:`~realtime_engine.talker.vllm_runner.VllmTalkerRunner` needs four
things of vLLM: run a request to its end (its audio travels separately, over
the side channel), abort one, start or stop the profiler, and say whether the
engine died. :class:`EngineLink` is that interface. :class:`LocalEngineLink`
does it on an ``AsyncLLM`` in this process; the talker host's
:class:`~realtime_engine.talker.talker_host.RemoteEngineLink` does it for a
gateway worker process, over a socket to the one process that owns the
``AsyncLLM`` (``serve --workers N``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class EngineRequest:
    """One talker request as vLLM sees it: a prompt, a token budget, our extra args."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: list[int]
    extra_args: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "prompt": self.prompt_ids,
            "max_tokens": self.max_tokens,
            "stop": self.stop_token_ids,
            "extra": self.extra_args,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any], request_id: str | None = None) -> EngineRequest:
        """From :meth:`to_wire`'s dict; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        prompt = [int(t) for t in raw["prompt"]]
        stop = [int(t) for t in raw["stop"]]
        extra = raw.get("extra") or {}
        if not isinstance(extra, dict):
            raise TypeError("extra must be an object")
        return cls(
            request_id if request_id is not None else str(raw["id"]),
            prompt,
            int(raw["max_tokens"]),
            stop,
            extra,
        )


class EngineLink(Protocol):
    async def run(self, request: EngineRequest) -> int:
        """Run ``request`` until vLLM finishes it; the tokens vLLM counted."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def start_profile(self) -> None: ...

    async def stop_profile(self) -> None: ...

    def failure(self) -> str | None:
        """Why the engine is dead, else None."""
        ...

    def shutdown(self) -> None: ...


class LocalEngineLink:
    """:class:`EngineLink` on vLLM's ``AsyncLLM`` (or an object with its interface)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    async def run(self, request: EngineRequest) -> int:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=0.0,
            stop_token_ids=request.stop_token_ids,
            detokenize=False,
            # Audio comes over the side channel; vLLM's own per-step outputs (one
            # object and one wake-up per request per step) would only be dropped.
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args=request.extra_args,
        )
        last = None
        async for out in self.llm.generate(
            {"prompt_token_ids": request.prompt_ids}, params, request_id=request.request_id
        ):
            last = out
        return len(last.outputs[0].token_ids) if last is not None and last.outputs else 0

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    async def start_profile(self) -> None:
        await self.llm.start_profile()

    async def stop_profile(self) -> None:
        await self.llm.stop_profile()

    def failure(self) -> str | None:
        """vLLM watches its engine core processes and marks the client errored at
        once when one exits; in-flight ``generate`` calls then fail."""
        if not getattr(self.llm, "errored", False):
            return None
        resources = getattr(getattr(self.llm, "engine_core", None), "resources", None)
        manager = getattr(resources, "engine_manager", None)
        failed = getattr(manager, "failed_proc_name", None)
        return f"the vLLM engine core{f' ({failed})' if failed else ''} died"

    def shutdown(self) -> None:
        self.llm.shutdown()
        # AsyncLLM's finaliser shuts down again; vLLM keeps references to the
        # engine, so that can happen at interpreter exit, after vLLM's module
        # globals are gone (TypeError). It is shut down: make that a no-op.
        self.llm.shutdown = _already_shut_down


def as_link(engine: Any) -> EngineLink:
    """``engine`` itself when it is a link, else an ``AsyncLLM`` wrapped in one."""
    if isinstance(engine, LocalEngineLink) or hasattr(engine, "run"):
        return engine
    return LocalEngineLink(engine)


def _already_shut_down(timeout: float | None = None) -> None:
    """Stands in for ``AsyncLLM.shutdown`` once the link has shut the engine down."""
