"""Per-request delay-pattern and termination state machine.

At decode step ``k`` (rows emitted so far) codebook ``c`` is in one mode:

- ``BOC_ONLY`` while ``c > k``: the codebook has not started yet (delay);
- ``EOC_ONLY`` once finished: codebook 0 sampled EOC at step ``s`` and
  ``c <= k - s`` (codebook ``c`` ran out of frames at row ``s + c``);
- ``CODE_OR_EOC`` for codebook 0 while it may end the utterance;
- ``CODE`` otherwise (real codes 0..1023 only).

The request is done after row ``s + N - 2``, i.e. ``T + N - 1`` rows for
``T = s`` real frames: exactly the rows of ``apply_delay`` on ``T`` frames,
so the emitted rows always revert cleanly. (The vLLM-Omni integration lets
codebook ``j`` sample one more real code at row ``s + j``; that code is
dropped by the revert anyway, and the training data has EOC there.)

Two optional per-request bounds shape the end: ``eoc_not_before`` bans EOC
before that step, ``eoc_at`` forces codebook 0 to EOC at that step. A
``max_new_tokens`` cap uses ``eoc_at = cap - (N - 1)`` so a capped utterance
still closes its pattern; a fixed length uses both.

:class:`TerminationState` is the scalar reference; :class:`BatchTermination`
is the same machine over slots as device tensors (fixed shapes, no host
sync) so a batched sampler can build masks and advance on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import numpy as np
import torch

from realtime_engine.talker.types import BOC, CODEBOOK_VOCAB, EOC, NUM_CODEBOOKS

# "never" for eoc_at, small enough that step arithmetic cannot overflow int64
NEVER = 1 << 60


class CodebookMode(IntEnum):
    CODE = 0
    CODE_OR_EOC = 1
    BOC_ONLY = 2
    EOC_ONLY = 3


def eoc_bounds(
    max_new_tokens: int | None, fixed_rows: int | None, num_codebooks: int = NUM_CODEBOOKS
) -> tuple[int, int]:
    """``(eoc_not_before, eoc_at)`` for a request's length limits.

    ``fixed_rows`` gives exactly that many rows (when >= N - 1); otherwise
    ``max_new_tokens`` caps the rows while letting the model stop earlier.
    """
    tail = num_codebooks - 1
    if fixed_rows is not None:
        at = max(fixed_rows - tail, 0)
        return at, at
    if max_new_tokens is not None:
        return 0, max(max_new_tokens - tail, 0)
    return 0, NEVER


class TerminationState:
    """Scalar delay/termination machine for one request."""

    def __init__(
        self,
        num_codebooks: int = NUM_CODEBOOKS,
        *,
        eoc_not_before: int = 0,
        eoc_at: int = NEVER,
    ) -> None:
        if num_codebooks < 2:
            raise ValueError("the delay pattern needs at least two codebooks")
        self.num_codebooks = num_codebooks
        self.eoc_not_before = eoc_not_before
        self.eoc_at = eoc_at
        self.step = 0
        self.eoc_step: int | None = None

    @property
    def done(self) -> bool:
        return self.eoc_step is not None and self.step - self.eoc_step >= self.num_codebooks - 1

    def _finished(self, codebook: int) -> bool:
        return self.eoc_step is not None and codebook <= self.step - self.eoc_step

    def modes(self) -> list[CodebookMode]:
        k = self.step
        out: list[CodebookMode] = []
        for c in range(self.num_codebooks):
            if c > k:
                out.append(CodebookMode.BOC_ONLY)
            elif self._finished(c) or (c == 0 and k >= self.eoc_at):
                out.append(CodebookMode.EOC_ONLY)
            elif c == 0 and k >= self.eoc_not_before:
                out.append(CodebookMode.CODE_OR_EOC)
            else:
                out.append(CodebookMode.CODE)
        return out

    def observe(self, sampled: Sequence[int] | np.ndarray) -> np.ndarray:
        """Take the sampled codes of this step; return the row to emit.

        Forced cells (BOC/EOC only) are overwritten whatever was sampled.
        """
        if self.done:
            raise RuntimeError("observe() after the request is done")
        row = np.array(sampled, dtype=np.int64)
        if row.shape != (self.num_codebooks,):
            raise ValueError(f"expected {self.num_codebooks} codes, got shape {row.shape}")
        for c, mode in enumerate(self.modes()):
            if mode is CodebookMode.BOC_ONLY:
                row[c] = BOC
            elif mode is CodebookMode.EOC_ONLY:
                row[c] = EOC
        if self.eoc_step is None and row[0] == EOC:
            self.eoc_step = self.step
        self.step += 1
        return row


def allowed_for_modes(modes: torch.Tensor, vocab: int = CODEBOOK_VOCAB) -> torch.Tensor:
    """Boolean mask ``[..., vocab]`` of the codes each mode permits."""
    v = torch.arange(vocab, device=modes.device)
    is_code = v < BOC
    is_boc = v == BOC
    is_eoc = v == EOC
    m = modes.unsqueeze(-1)
    return (
        ((m == int(CodebookMode.CODE)) & is_code)
        | ((m == int(CodebookMode.CODE_OR_EOC)) & (is_code | is_eoc))
        | ((m == int(CodebookMode.BOC_ONLY)) & is_boc)
        | ((m == int(CodebookMode.EOC_ONLY)) & is_eoc)
    )


def batch_modes(
    step: torch.Tensor,
    eoc_step: torch.Tensor,
    eoc_not_before: torch.Tensor,
    eoc_at: torch.Tensor,
    num_codebooks: int = NUM_CODEBOOKS,
) -> torch.Tensor:
    """Modes ``[B, N]`` for per-row state ``[B]`` (``eoc_step < 0``: not ended)."""
    c = torch.arange(num_codebooks, device=step.device).unsqueeze(0)
    k = step.unsqueeze(1)
    ended = (eoc_step >= 0).unsqueeze(1)
    finished = ended & (c <= k - eoc_step.unsqueeze(1))
    first = c == 0
    forced_end = first & (k >= eoc_at.unsqueeze(1))
    may_end = first & (k >= eoc_not_before.unsqueeze(1))
    modes = torch.full_like(finished, int(CodebookMode.CODE), dtype=torch.int64)
    modes = torch.where(may_end, int(CodebookMode.CODE_OR_EOC), modes)
    modes = torch.where(forced_end | finished, int(CodebookMode.EOC_ONLY), modes)
    return torch.where(c > k, int(CodebookMode.BOC_ONLY), modes)


def apply_forced(codes: torch.Tensor, modes: torch.Tensor) -> torch.Tensor:
    """Overwrite the cells whose mode admits a single code."""
    # plain ints: torch.compile traces an IntEnum comparison as a Python bool
    codes = torch.where(modes == int(CodebookMode.BOC_ONLY), BOC, codes)
    return torch.where(modes == int(CodebookMode.EOC_ONLY), EOC, codes)


class BatchTermination:
    """:class:`TerminationState` for ``max_slots`` slots as device tensors.

    Rows of a step address slots through an index tensor ``slots[B]`` so the
    batch order may differ from the slot order. Every method uses fixed
    shapes and tensor ops only (no ``.item()``), so it runs inside a device
    sampler without host synchronisation.
    """

    def __init__(
        self, max_slots: int, num_codebooks: int = NUM_CODEBOOKS, device: torch.device | str = "cpu"
    ) -> None:
        if num_codebooks < 2:
            raise ValueError("the delay pattern needs at least two codebooks")
        self.num_codebooks = num_codebooks
        dev = torch.device(device)
        self.step = torch.zeros(max_slots, dtype=torch.int64, device=dev)
        self.eoc_step = torch.full((max_slots,), -1, dtype=torch.int64, device=dev)
        self.eoc_not_before = torch.zeros(max_slots, dtype=torch.int64, device=dev)
        self.eoc_at = torch.full((max_slots,), NEVER, dtype=torch.int64, device=dev)

    def reset(
        self, slots: torch.Tensor, eoc_not_before: torch.Tensor, eoc_at: torch.Tensor
    ) -> None:
        """Start fresh requests in ``slots`` (int64 ``[B]``) with their bounds."""
        self.step.index_fill_(0, slots, 0)
        self.eoc_step.index_fill_(0, slots, -1)
        self.eoc_not_before.index_copy_(0, slots, eoc_not_before.to(self.step))
        self.eoc_at.index_copy_(0, slots, eoc_at.to(self.step))

    def reset_slot(self, slot: int, eoc_not_before: int, eoc_at: int) -> None:
        """:meth:`reset` of one slot from host values, written as scalar fills: no
        host tensor is copied to the device, so the host never waits for it."""
        self.step[slot].fill_(0)
        self.eoc_step[slot].fill_(-1)
        self.eoc_not_before[slot].fill_(eoc_not_before)
        self.eoc_at[slot].fill_(eoc_at)

    def modes(self, slots: torch.Tensor) -> torch.Tensor:
        return batch_modes(
            self.step.index_select(0, slots),
            self.eoc_step.index_select(0, slots),
            self.eoc_not_before.index_select(0, slots),
            self.eoc_at.index_select(0, slots),
            self.num_codebooks,
        )

    def allowed(self, slots: torch.Tensor) -> torch.Tensor:
        """Boolean mask ``[B, N, 1026]`` of the codes each cell may take."""
        return allowed_for_modes(self.modes(slots))

    def advance(
        self, slots: torch.Tensor, sampled: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Record one sampled step ``[B, N]``; return ``(rows [B, N], done [B])``.

        Rows where ``valid`` (bool ``[B]``) is False leave their slot's state
        untouched and report ``done`` False (padding rows, partial prefills).
        """
        old_step = self.step.index_select(0, slots)
        old_eoc = self.eoc_step.index_select(0, slots)
        rows = apply_forced(sampled.to(torch.int64), self.modes(slots))
        newly_ended = (old_eoc < 0) & (rows[:, 0] == EOC)
        eoc_step = torch.where(newly_ended, old_step, old_eoc)
        step = old_step + 1
        done = (eoc_step >= 0) & (step - eoc_step >= self.num_codebooks - 1)
        if valid is not None:
            step = torch.where(valid, step, old_step)
            eoc_step = torch.where(valid, eoc_step, old_eoc)
            done = done & valid
        self.step.index_copy_(0, slots, step)
        self.eoc_step.index_copy_(0, slots, eoc_step)
        return rows, done
