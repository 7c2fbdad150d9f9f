"""Per-slot talker state inside vLLM's Model Runner V2, and the code sampler.

The runner keeps requests in slots ``[0, max_num_seqs)``. For each slot this
state holds, on the device: the codes of every audio position by sequence
position (voice-clone reference rows written at admission, generated rows
written by the sampler), the delay/termination machine, and the sampling
settings. One extra "trash" slot absorbs writes of rows that must not land
anywhere (partial prefill chunks, finished requests), so every update is a
fixed-shape scatter with no host synchronisation.

Each step:

1. ``prepare_inputs`` looks up, for every scheduled token, whether its
   position is audio and which codes it holds, and copies that into the
   model's fixed buffers (feedback of the previous row, CUDA-graph safe).
2. The model returns audio logits; :class:`HiggsCodeSampler` masks them with
   the delay pattern, samples all codebooks, advances the machine, records
   the row, and answers vLLM with ``<|audio|>`` (or eos once the request is
   done, which makes vLLM finish it).
3. The rows go to the serving process through :class:`RowPublisher`.

Version notes (vLLM 0.26 vs 0.32): hook names and signatures are the same;
``NewRequestData.prompt_len`` exists only in 0.32, so the prompt length is
taken from ``prompt_token_ids``; ``SamplerOutput`` gained fields over time,
so it is built from the fields the installed version declares.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.model_states.default import DefaultModelState

try:
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
except ImportError:  # releases where MRv2 returned the shared V1 type
    from vllm.v1.outputs import SamplerOutput  # type: ignore[assignment]

from realtime_engine.talker.sampling import BatchSampling, sample_codes
from realtime_engine.talker.termination import BatchTermination, allowed_for_modes
from realtime_engine.talker.vllm_protocol import MAX_RAS_WINDOW, TalkerArgs
from realtime_engine.talker.vllm_publish import RowPublisher, StepRows
from realtime_engine.talker.vllm_sampling import counter_noise, recent_codes

logger = logging.getLogger(__name__)


class HiggsModelState(DefaultModelState):
    def __init__(
        self, vllm_config: VllmConfig, model: nn.Module, encoder_cache: Any, device: torch.device
    ) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        cfg = cast(Any, model).talker_config
        self.num_codebooks: int = cfg.num_codebooks
        self.codebook_vocab: int = cfg.codebook_vocab
        if vllm_config.cache_config.enable_prefix_caching:
            # Every request's generated tokens are the same <|audio|> id: cached KV
            # from another request would carry that request's audio embeddings.
            raise ValueError(
                "the Higgs talker needs prefix caching off (enable_prefix_caching=False)"
            )
        slots = self.max_num_reqs + 1  # the last slot is the trash slot
        self.trash_slot = self.max_num_reqs
        self.max_len = int(self.max_model_len)
        dev = device
        self.codes_by_pos = torch.zeros(
            slots, self.max_len, self.num_codebooks, dtype=torch.int16, device=dev
        )
        self.audio_at_pos = torch.zeros(slots, self.max_len, dtype=torch.bool, device=dev)
        self.prompt_len = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.prefill_len = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.live = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.audio_token = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.eos_token = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.temperature = torch.ones(slots, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(slots, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.ras_window = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.ras_max_repeat = torch.ones(slots, dtype=torch.int64, device=dev)
        self.termination = BatchTermination(slots, self.num_codebooks, dev)
        # Host side: which request and destination each slot serves.
        self.slot_of: dict[str, int] = {}
        self.args_of_slot: dict[int, TalkerArgs] = {}
        self.publisher = RowPublisher(device, enabled=_is_first_rank(vllm_config))
        self._saved: OrderedDict[str, _SavedSlot] = OrderedDict()
        self.fallback_eos = int(
            getattr(vllm_config.model_config.hf_config.get_text_config(), "eos_token_id", 0) or 0
        )

    # -- request lifecycle -------------------------------------------------

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)
        slot = req_index
        self.slot_of[new_req_data.req_id] = slot
        params = new_req_data.sampling_params
        args = TalkerArgs.from_extra_args(params.extra_args if params is not None else None)
        prompt_len = len(new_req_data.prompt_token_ids or ())
        prefill = new_req_data.prefill_token_ids
        idx = torch.tensor([slot], dtype=torch.int64, device=self.device)
        self.audio_at_pos[slot].zero_()
        self.prompt_len[slot] = prompt_len
        self.prefill_len[slot] = len(prefill) if prefill is not None else prompt_len
        if args is None:
            # vLLM's own warm-up requests (``_warmup_*``) carry none; anything else is misuse.
            log = logger.debug if new_req_data.req_id.startswith("_warmup") else logger.warning
            log("request %s has no talker settings; stopping it", new_req_data.req_id)
            self.live[slot] = False
            self.eos_token[slot] = self.fallback_eos
            return
        self.args_of_slot[slot] = args
        saved = self._saved.pop(new_req_data.req_id, None)
        if prefill is not None and len(prefill) > prompt_len:
            # A preempted request resumes with its generated tokens as prefill: their
            # audio embeddings must come from the rows it had produced.
            if saved is None:
                self.live[slot] = False
                self.eos_token[slot] = args.eos_token_id
                self.publisher.fail(args, "resumed request has no saved audio history")
                return
            self._apply_params(slot, args)
            saved.restore(self, slot)
            return
        if args.ref_rows:
            end = args.ref_offset + len(args.ref_rows)
            if end > prompt_len:
                raise ValueError("voice-clone rows extend past the prompt")
            rows = torch.tensor(args.ref_rows, dtype=torch.int16)
            self.codes_by_pos[slot, args.ref_offset : end] = rows.to(self.device)
            self.audio_at_pos[slot, args.ref_offset : end] = True
        self.live[slot] = True
        self._apply_params(slot, args)
        self.termination.reset(
            idx,
            torch.tensor([args.eoc_not_before], device=self.device),
            torch.tensor([args.eoc_at], device=self.device),
        )

    def _apply_params(self, slot: int, args: TalkerArgs) -> None:
        self.audio_token[slot] = args.audio_token_id
        self.eos_token[slot] = args.eos_token_id
        self.temperature[slot] = args.temperature
        self.top_k[slot] = args.top_k
        self.top_p[slot] = args.top_p
        self.seed[slot] = args.seed
        self.ras_window[slot] = args.ras_window
        self.ras_max_repeat[slot] = args.ras_max_repeat

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)
        slot = self.slot_of.pop(req_id, None)  # also called for ids never added
        if slot is None:
            return
        if self.args_of_slot.pop(slot, None) is not None:
            # Finished and preempted look alike here: keep the audio history in case
            # the request comes back (bounded; the oldest entries go first).
            self._saved[req_id] = _SavedSlot.take(self, slot)
            while len(self._saved) > 2 * self.max_num_reqs:
                self._saved.popitem(last=False)
        self.live[slot] = False

    # -- per-step inputs -----------------------------------------------------

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        out = super().prepare_inputs(input_batch, req_states)
        model = cast(Any, self.model)
        n = input_batch.num_tokens
        n_pad = input_batch.num_tokens_after_padding
        num_reqs = input_batch.num_reqs
        if num_reqs == 0 or n == 0:
            model.audio_mask[:n_pad] = False
            return out
        token = torch.arange(n, device=self.device)
        ends = input_batch.query_start_loc[1 : num_reqs + 1]
        row = torch.searchsorted(ends, token, right=True).clamp_(max=num_reqs - 1)
        slot = input_batch.idx_mapping[row].long()
        pos = input_batch.positions[:n].long().clamp(0, self.max_len - 1)
        model.audio_codes[:n] = self.codes_by_pos[slot, pos].long()
        model.audio_mask[:n] = self.audio_at_pos[slot, pos]
        model.audio_mask[n:n_pad] = False
        return out

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        cast(Any, self.model).audio_mask[:num_tokens] = False
        return super().prepare_dummy_inputs(num_reqs, num_tokens)

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any]:
        return HiggsCodeSampler(sampler, self), None

    # -- sampling --------------------------------------------------------------

    def sample(self, logits: torch.Tensor, input_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample rows for the batch.

        Returns the text token each request takes and whether the row was a
        real step (a non-final chunk of a chunked prefill also reaches the
        sampler), both ``[B]``. Computed on the device from the sequence
        lengths: a host array copied up would synchronise the stream.
        """
        b = input_batch.num_reqs
        slots = input_batch.idx_mapping[:b].long()
        real = input_batch.seq_lens[:b] >= self.prefill_len[slots]
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
            logits[:b].view(b, self.num_codebooks, self.codebook_vocab),
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
        self.audio_at_pos[target, pos] = True
        self.live.index_copy_(0, slots, self.live[slots] & ~done)
        self.publisher.publish(
            StepRows(rows=rows, valid=valid, done=done, index=step),
            [self.args_of_slot.get(int(s)) for s in input_batch.idx_mapping_np[:b]],
        )
        stop = done | ~self.live[slots]
        return torch.where(stop, self.eos_token[slots], self.audio_token[slots]), real


def _is_first_rank(vllm_config: VllmConfig) -> bool:
    """Only one tensor-parallel rank sends rows (every rank samples the same ones:
    the noise is a function of seed and step, so ranks agree without talking)."""
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError("the Higgs talker does not support pipeline parallelism")
    if vllm_config.parallel_config.tensor_parallel_size == 1:
        return True
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return bool(get_tensor_model_parallel_rank() == 0)


@dataclass(frozen=True)
class _SavedSlot:
    """A slot's audio history and machine state, copied on the device."""

    codes: torch.Tensor
    audio: torch.Tensor
    live: torch.Tensor
    step: torch.Tensor
    eoc_step: torch.Tensor
    eoc_not_before: torch.Tensor
    eoc_at: torch.Tensor

    @classmethod
    def take(cls, state: HiggsModelState, slot: int) -> _SavedSlot:
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

    def restore(self, state: HiggsModelState, slot: int) -> None:
        t = state.termination
        state.codes_by_pos[slot] = self.codes
        state.audio_at_pos[slot] = self.audio
        state.live[slot] = self.live
        t.step[slot] = self.step
        t.eoc_step[slot] = self.eoc_step
        t.eoc_not_before[slot] = self.eoc_not_before
        t.eoc_at[slot] = self.eoc_at


class HiggsCodeSampler:
    """Sampler wrapper: code rows instead of text tokens; everything else is the base sampler's."""

    def __init__(self, base: Any, state: HiggsModelState) -> None:
        self._base = base
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def __call__(self, logits: torch.Tensor, input_batch: Any) -> Any:
        tokens, real = self._state.sample(logits, input_batch)
        num_sampled = real.to(input_batch.seq_lens.dtype)
        values: dict[str, Any] = {
            "sampled_token_ids": tokens.view(-1, 1),
            "logprobs_tensors": None,
            "num_nans": None,
            "num_sampled": num_sampled,
            "num_rejected": torch.zeros_like(num_sampled),
        }
        names = {f.name for f in dataclasses.fields(SamplerOutput)}
        return SamplerOutput(**{k: v for k, v in values.items() if k in names})
