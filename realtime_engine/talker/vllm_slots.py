"""The talker's per-slot device state and its sampling step, free of vLLM.

vLLM's runner keeps requests in slots ``[0, max_slots)``. For each slot this
holds, on the device: the codes of every audio position by sequence position
(voice-clone reference rows written at admission, generated rows written by
the step), the delay/termination machine and the sampling settings. One extra
"trash" slot absorbs writes of rows that must not land anywhere (partial
prefill chunks, finished requests, padding rows), so every update is a
fixed-shape scatter with no host synchronisation, and the step can be
captured as a CUDA graph.

Admission, stopping and removal write a slot's settings as scalar fills
(``x[slot].fill_(value)``), never ``x[slot] = value``: the latter copies a
host scalar to the device, and that copy makes the host wait until the
device has run everything queued before it (with vLLM's async scheduling,
a step's worth of work the host would otherwise be preparing the next
step during).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from realtime_engine.talker.sampling import BatchSampling, sample_codes
from realtime_engine.talker.termination import BatchTermination, allowed_for_modes
from realtime_engine.talker.vllm_protocol import MAX_RAS_WINDOW, TalkerArgs
from realtime_engine.talker.vllm_publish import StepRows
from realtime_engine.talker.vllm_sampling import counter_noise, recent_codes


class TalkerSlots:
    def __init__(
        self,
        max_slots: int,
        max_len: int,
        num_codebooks: int,
        codebook_vocab: int,
        device: torch.device,
    ) -> None:
        n = max_slots + 1  # the last slot is the trash slot
        self.trash_slot = max_slots
        self.max_len = max_len
        self.num_codebooks = num_codebooks
        self.codebook_vocab = codebook_vocab
        self.device = device
        dev = device
        self.codes_by_pos = torch.zeros(n, max_len, num_codebooks, dtype=torch.int16, device=dev)
        self.audio_at_pos = torch.zeros(n, max_len, dtype=torch.bool, device=dev)
        self.prompt_len = torch.zeros(n, dtype=torch.int64, device=dev)
        self.prefill_len = torch.zeros(n, dtype=torch.int64, device=dev)
        self.live = torch.zeros(n, dtype=torch.bool, device=dev)
        self.audio_token = torch.zeros(n, dtype=torch.int64, device=dev)
        self.eos_token = torch.zeros(n, dtype=torch.int64, device=dev)
        self.temperature = torch.ones(n, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(n, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(n, dtype=torch.int64, device=dev)
        self.ras_window = torch.zeros(n, dtype=torch.int64, device=dev)
        self.ras_max_repeat = torch.ones(n, dtype=torch.int64, device=dev)
        self.termination = BatchTermination(n, num_codebooks, dev)

    # -- admission -------------------------------------------------------------

    def admit(self, slot: int, args: TalkerArgs, prompt_len: int, prefill_len: int) -> None:
        """Start a fresh request in ``slot`` (voice-clone rows written in place)."""
        self.begin(slot, prompt_len, prefill_len)
        if args.ref_rows:
            end = args.ref_offset + len(args.ref_rows)
            if end > prompt_len:
                raise ValueError("voice-clone rows extend past the prompt")
            rows = torch.tensor(args.ref_rows, dtype=torch.int16)
            if self.device.type == "cuda":  # from pinned memory: the host need not wait
                rows = rows.pin_memory()
            self.codes_by_pos[slot, args.ref_offset : end].copy_(rows, non_blocking=True)
            self.audio_at_pos[slot, args.ref_offset : end].fill_(True)
        self.live[slot].fill_(True)
        self.apply_params(slot, args)
        self.termination.reset_slot(slot, args.eoc_not_before, args.eoc_at)

    def begin(self, slot: int, prompt_len: int, prefill_len: int) -> None:
        self.audio_at_pos[slot].zero_()
        self.prompt_len[slot].fill_(prompt_len)
        self.prefill_len[slot].fill_(prefill_len)

    def stop(self, slot: int, eos_token_id: int) -> None:
        """The slot answers eos at its next step (vLLM then finishes the request)."""
        self.live[slot].fill_(False)
        self.eos_token[slot].fill_(eos_token_id)

    def release(self, slot: int) -> None:
        """vLLM let go of the slot's request: nothing there is live any more."""
        self.live[slot].fill_(False)

    def apply_params(self, slot: int, args: TalkerArgs) -> None:
        for buffer, value in (
            (self.audio_token, args.audio_token_id),
            (self.eos_token, args.eos_token_id),
            (self.temperature, args.temperature),
            (self.top_k, args.top_k),
            (self.top_p, args.top_p),
            (self.seed, args.seed),
            (self.ras_window, args.ras_window),
            (self.ras_max_repeat, args.ras_max_repeat),
        ):
            buffer[slot].fill_(value)

    # -- one step ----------------------------------------------------------------

    def step(
        self, logits: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one row per batch entry: ``(tokens [B], real [B], packed [B, N + 3])``.

        ``logits`` ``[B, N * V]``, ``slots`` and ``seq_lens`` int64 ``[B]``. A
        row is a real step once its sequence length covers the prefill (a
        non-final chunk of a chunked prefill also reaches the sampler); read
        from the device, since a host array copied up would synchronise the
        stream. Rows of the trash slot with ``seq_lens`` 0 are padding: never
        valid, they change nothing but the trash slot. ``tokens`` is the
        ``<|audio|>`` id, or eos once a request is done; ``packed`` is
        :meth:`StepRows.packed` for the row publisher.
        """
        b = logits.shape[0]
        real = seq_lens >= self.prefill_len[slots]
        valid = real & self.live[slots]
        term = self.termination
        step = term.step.index_select(0, slots)
        eoc_step = term.eoc_step.index_select(0, slots)
        allowed = allowed_for_modes(term.modes(slots), self.codebook_vocab)
        params = BatchSampling(
            temperature=self.temperature[slots],
            top_k=self.top_k[slots],
            top_p=self.top_p[slots],
            ras_window=self.ras_window[slots],
            ras_max_repeat=self.ras_max_repeat[slots],
        )
        codes = sample_codes(
            logits.view(b, self.num_codebooks, self.codebook_vocab),
            allowed,
            params,
            counter_noise(self.seed[slots], step, self.num_codebooks, self.codebook_vocab),
            recent_codes(self.codes_by_pos, self.prompt_len, slots, step, MAX_RAS_WINDOW),
        ).codes
        rows, done = term.advance(slots, codes)
        # Undo the advance for rows that were not real steps.
        term.step.index_copy_(0, slots, torch.where(valid, term.step.index_select(0, slots), step))
        term.eoc_step.index_copy_(
            0, slots, torch.where(valid, term.eoc_step.index_select(0, slots), eoc_step)
        )
        done = done & valid
        target = torch.where(valid, slots, self.trash_slot)
        pos = (self.prompt_len[slots] + step).clamp(max=self.max_len - 1)
        self.codes_by_pos[target, pos] = rows.to(torch.int16)
        # A device tensor, not a Python True: setitem would copy a CPU scalar to the
        # GPU, which CUDA graph capture refuses.
        self.audio_at_pos.index_put_((target, pos), torch.ones_like(valid))
        self.live.index_copy_(0, slots, self.live[slots] & ~done)
        packed = StepRows(rows=rows, valid=valid, done=done, index=step).packed()
        stop = done | ~self.live[slots]
        tokens = torch.where(stop, self.eos_token[slots], self.audio_token[slots])
        return tokens, real, packed


@dataclass(frozen=True)
class SavedSlot:
    """A slot's audio history and machine state, copied on the device (preemption)."""

    codes: torch.Tensor
    audio: torch.Tensor
    live: torch.Tensor
    step: torch.Tensor
    eoc_step: torch.Tensor
    eoc_not_before: torch.Tensor
    eoc_at: torch.Tensor

    @classmethod
    def take(cls, state: TalkerSlots, slot: int) -> SavedSlot:
        t = state.termination
        return cls(
            codes=state.codes_by_pos[slot].clone(),
            audio=state.audio_at_pos[slot].clone(),
            live=state.live[slot].clone(),
            step=t.step[slot].clone(),
            eoc_step=t.eoc_step[slot].clone(),
            eoc_not_before=t.eoc_not_before[slot].clone(),
            eoc_at=t.eoc_at[slot].clone(),
        )

    def restore(self, state: TalkerSlots, slot: int) -> None:
        t = state.termination
        state.codes_by_pos[slot] = self.codes
        state.audio_at_pos[slot] = self.audio
        state.live[slot] = self.live
        t.step[slot] = self.step
        t.eoc_step[slot] = self.eoc_step
        t.eoc_not_before[slot] = self.eoc_not_before
        t.eoc_at[slot] = self.eoc_at
