"""A :class:`TalkerRequest` as the vLLM talker runs it: its row budget and its
:class:`TalkerArgs` (pure functions; :class:`VllmTalkerRunner` sends them)."""

from __future__ import annotations

import secrets

from realtime_engine.format import ChunkingParams
from realtime_engine.model.tokenizer import SpecialIds
from realtime_engine.talker.termination import eoc_bounds
from realtime_engine.talker.types import NUM_CODEBOOKS, TalkerError, TalkerRequest
from realtime_engine.talker.vllm_protocol import MAX_RAS_WINDOW, TalkerArgs, TalkerArgsError

RowBudget = tuple[int | None, int | None]  # (max_new_tokens, fixed_rows)


def row_budget(request: TalkerRequest, prompt_len: int, max_model_len: int | None) -> RowBudget:
    """``(max_new_tokens, fixed_rows)`` fitted to the context left after the prompt.

    A cap that would run past ``max_model_len`` is lowered so the request
    still closes its delay pattern (vLLM would otherwise cut it mid-row).
    """
    room = None if max_model_len is None else max_model_len - prompt_len
    if room is not None and room < NUM_CODEBOOKS:
        raise TalkerError(f"prompt of {prompt_len} tokens leaves no room to speak")
    if request.fixed_rows is not None:
        if room is not None and request.fixed_rows > room:
            raise TalkerError(f"fixed_rows {request.fixed_rows} exceeds the {room} rows left")
        return None, request.fixed_rows
    cap = request.max_new_tokens if room is None else min(request.max_new_tokens, room)
    return cap, None


def talker_args(
    request: TalkerRequest,
    correlation_id: str,
    endpoint: str,
    specials: SpecialIds,
    budget: RowBudget,
    ref: tuple[int, tuple[tuple[int, ...], ...]],
    chunking: ChunkingParams | None,
) -> TalkerArgs:
    """What the worker needs of ``request``: sampling, end-of-codes bounds, the
    voice reference's rows, the chunking (audio) or none (rows), and where to
    send the output. A :class:`TalkerError` for values out of range."""
    s = request.sampling
    if s.ras_window > MAX_RAS_WINDOW:
        raise TalkerError(f"ras_window {s.ras_window} exceeds {MAX_RAS_WINDOW}")
    not_before, at = eoc_bounds(*budget)
    offset, rows = ref
    try:
        return TalkerArgs(
            correlation_id=correlation_id,
            endpoint=endpoint,
            audio_token_id=specials.audio,
            eos_token_id=specials.eos,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            ras_window=s.ras_window,
            ras_max_repeat=s.ras_max_repeat,
            seed=s.seed if s.seed is not None else secrets.randbits(62),
            eoc_not_before=not_before,
            eoc_at=at,
            ref_offset=offset,
            ref_rows=rows,
            chunking=None if chunking is None else TalkerArgs.chunking_fields(chunking),
            return_rows=request.return_rows and chunking is not None,
        )
    except TalkerArgsError as e:
        raise TalkerError(str(e)) from e
