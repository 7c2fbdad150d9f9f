"""The talker inside vLLM's Model Runner V2: request hooks and the code sampler.

Per-slot device state lives in :class:`~realtime_engine.talker.vllm_slots.TalkerSlots`
(free of vLLM, tested on its own); this module connects it to the runner's hooks.
Each step:

1. ``prepare_inputs`` looks up, for every scheduled token, whether its
   position is audio and which codes it holds, and copies that into the
   model's fixed buffers (feedback of the previous row, CUDA-graph safe).
2. The model returns audio logits; :class:`HiggsCodeSampler` masks them with
   the delay pattern, samples all codebooks, advances the machine, records
   the row, and answers vLLM with ``<|audio|>`` (or eos once the request is
   done, which makes vLLM finish it). On CUDA this runs as one captured graph
   per batch-size bucket (:mod:`.vllm_sampler_graphs`).
3. Requests that asked for audio get it decoded here, beside the talker,
   from the slot table (:mod:`.vllm_audio`): PCM chunks go to the serving
   process, the rows never leave the device. Requests that asked for rows
   (tools, tests) get them through :class:`RowPublisher`.

Version notes (vLLM 0.26 vs 0.32): hook names and signatures are the same;
``NewRequestData.prompt_len`` exists only in 0.32, so the prompt length is
taken from ``prompt_token_ids``; ``SamplerOutput`` gained fields over time,
so it is built from the fields the installed version declares.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.model_states.default import DefaultModelState

try:
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
except ImportError:  # releases where MRv2 returned the shared V1 type
    from vllm.v1.outputs import SamplerOutput  # type: ignore[assignment]

from realtime_engine.codec.causal import (
    DEFAULT_GEMM_TAPS,
    GEMM_TAPS_VALUES,
    GemmChannels,
    GemmTaps,
)
from realtime_engine.codec.fused_unit import (
    DEFAULT_FUSED_UNITS,
    FUSED_UNITS_VALUES,
    FusedUnitsOption,
)
from realtime_engine.format import (
    DEFAULT_CODEC_COMPILE_MODE,
    DEFAULT_CODEC_FRAMES_PER_CALL,
    DEFAULT_CODEC_KERNELS,
    DEFAULT_CODEC_STREAM_PRIORITY,
    frame_counts,
)
from realtime_engine.talker.compile_workers import own_compile_cache
from realtime_engine.talker.vllm_audio import VllmAudio
from realtime_engine.talker.vllm_protocol import SAMPLER_CONFIG_KEY, TalkerArgs
from realtime_engine.talker.vllm_publish import RowPublisher
from realtime_engine.talker.vllm_rows import set_process_rank
from realtime_engine.talker.vllm_sampler_graphs import PaddedStepGraphs, graphs_wanted
from realtime_engine.talker.vllm_slots import SavedSlot, TalkerSlots

logger = logging.getLogger(__name__)


class HiggsModelState(DefaultModelState):
    def __init__(
        self, vllm_config: VllmConfig, model: nn.Module, encoder_cache: Any, device: torch.device
    ) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        cfg = cast(Any, model).talker_config
        if vllm_config.cache_config.enable_prefix_caching:
            # Every request's generated tokens are the same <|audio|> id: cached KV
            # from another request would carry that request's audio embeddings.
            raise ValueError(
                "the Higgs talker needs prefix caching off (enable_prefix_caching=False)"
            )
        self.slots = TalkerSlots(
            self.max_num_reqs,
            int(self.max_model_len),
            cfg.num_codebooks,
            cfg.codebook_vocab,
            device,
        )
        # Host side: which request and destination each slot serves.
        self.slot_of: dict[str, int] = {}
        self.args_of_slot: dict[int, TalkerArgs] = {}
        # What each step routes by, per slot (vLLM's request index): the audio
        # request's key, or the row request's settings. Lists, so that a step of
        # 256 requests costs a list index each, not a lookup and a test.
        self._audio_key_of_slot: list[str | None] = [None] * self.max_num_reqs
        self._row_args_of_slot: list[TalkerArgs | None] = [None] * self.max_num_reqs
        first_rank = _is_first_rank(vllm_config)
        # Before the audio's pusher exists: it stamps this rank on every chunk.
        self.dp_rank = data_parallel_rank(vllm_config)
        set_process_rank(self.dp_rank)
        self.publisher = RowPublisher(device, enabled=first_rank)
        codec = getattr(model, "codec", None)
        # Only the first tensor-parallel rank decodes and sends audio.
        use_graphs = graphs_wanted(device, bool(vllm_config.model_config.enforce_eager))
        codec_options = cast(Any, model).codec_options
        switch_ms = switch_interval_option(codec_options)
        if switch_ms is not None and codec is not None and first_rank:
            sys.setswitchinterval(switch_ms / 1000)  # this engine core's process
            logger.info("interpreter switch interval: %.2f ms", switch_ms)
        self.audio = (
            VllmAudio(
                codec,
                self.slots.codes_by_pos,
                max_batch=int(codec_options.get("max_batch", 64)),
                keep=2 * self.max_num_reqs,
                graphs=use_graphs,
                kernels=str(codec_options.get("kernels", DEFAULT_CODEC_KERNELS)),
                stream_priority=str(
                    codec_options.get("stream_priority", DEFAULT_CODEC_STREAM_PRIORITY)
                ),
                decode_thread=decode_thread_option(codec_options),
                gemm_channels=gemm_channels_option(codec_options),
                compile_mode=str(codec_options.get("compile_mode", DEFAULT_CODEC_COMPILE_MODE)),
                frames_per_call=frames_per_call_option(codec_options),
                fused_units=fused_units_option(codec_options),
                gemm_taps=gemm_taps_option(codec_options),
            )
            if codec is not None and first_rank
            else None
        )
        self._sends_audio = first_rank
        self._warm = False
        self._graphs = (
            PaddedStepGraphs(
                self.slots.step,
                max_batch=self.max_num_reqs,
                pad_slot=self.slots.trash_slot,
                device=device,
                compiled=sampler_compiled(vllm_config),
            )
            if use_graphs
            else None
        )
        self._saved: OrderedDict[str, SavedSlot] = OrderedDict()
        self.fallback_eos = int(
            getattr(vllm_config.model_config.hf_config.get_text_config(), "eos_token_id", 0) or 0
        )

    # -- request lifecycle -------------------------------------------------

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        if self.audio is not None:
            # the slot's rows are about to change: not before the codec read them
            self.audio.fence()
        super().add_request(req_index, new_req_data)
        slot = req_index
        self._route(slot, None)
        self.slot_of[new_req_data.req_id] = slot
        params = new_req_data.sampling_params
        args = TalkerArgs.from_extra_args(params.extra_args if params is not None else None)
        prompt_len = len(new_req_data.prompt_token_ids or ())
        prefill = new_req_data.prefill_token_ids
        prefill_len = len(prefill) if prefill is not None else prompt_len
        if args is None:
            # vLLM's own warm-up requests (``_warmup_*``) carry none; anything else is misuse.
            log = logger.debug if new_req_data.req_id.startswith("_warmup") else logger.warning
            log("request %s has no talker settings; stopping it", new_req_data.req_id)
            self.slots.begin(slot, prompt_len, prefill_len)
            self.slots.stop(slot, self.fallback_eos)
            return
        if args.chunking is not None and self.audio is None and self._sends_audio:
            self.slots.begin(slot, prompt_len, prefill_len)
            self.slots.stop(slot, args.eos_token_id)
            self.publisher.fail(args, "this checkpoint has no codec to decode audio with")
            return
        self.args_of_slot[slot] = args
        self._route(slot, args)
        saved = self._saved.pop(new_req_data.req_id, None)
        if prefill_len > prompt_len:
            # A preempted request resumes with its generated tokens as prefill: their
            # audio embeddings must come from the rows it had produced.
            self.slots.begin(slot, prompt_len, prefill_len)
            if saved is None:
                self.slots.stop(slot, args.eos_token_id)
                self.publisher.fail(args, "resumed request has no saved audio history")
                return
            self.slots.apply_params(slot, args)
            saved.restore(self.slots, slot)
            audio = self.audio
            if args.chunking is not None and audio is not None and not audio.resume(args, slot):
                self.slots.stop(slot, args.eos_token_id)
                audio.fail(args, "resumed request has no saved audio state")
            return
        self.slots.admit(slot, args, prompt_len, prefill_len)
        if args.chunking is not None and self.audio is not None:
            self.audio.open(args, slot, prompt_len)

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)
        slot = self.slot_of.pop(req_id, None)  # also called for ids never added
        if slot is None:
            return
        args = self.args_of_slot.pop(slot, None)
        self._route(slot, None)
        if args is not None:
            # Finished and preempted look alike here: send what the known rows allow
            # (all of a finished request's audio), and keep the audio history in case
            # the request comes back (bounded; the oldest entries go first). A request
            # whose audio ended cannot come back: nothing of it is kept.
            may_return = True
            if args.chunking is not None and self.audio is not None:
                may_return = self.audio.remove(args.correlation_id)
            if may_return:
                self._saved[req_id] = SavedSlot.take(self.slots, slot)
                while len(self._saved) > 2 * self.max_num_reqs:
                    self._saved.popitem(last=False)
        self.slots.release(slot)

    # -- per-step inputs -----------------------------------------------------

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        if self.audio is not None:
            # Rows of the previous step are often on the host by now: start their
            # chunks before this step's forward pass, so the two overlap.
            self.audio.poll()
        out = super().prepare_inputs(input_batch, req_states)
        model = cast(Any, self.model)
        n = input_batch.num_tokens
        n_pad = input_batch.num_tokens_after_padding
        num_reqs = input_batch.num_reqs
        if num_reqs == 0 or n == 0:
            model.audio_mask[:n_pad] = False
            return out
        # Every step runs this before its forward pass: few operator calls. A
        # step of decodes only has one token per request, in request order.
        # (No operation here is in place: the inputs are vLLM's own buffers.)
        if n == num_reqs:
            slot = input_batch.idx_mapping[:n]
        else:
            token = torch.arange(n, device=self.device)
            ends = input_batch.query_start_loc[1 : num_reqs + 1]
            row = torch.searchsorted(ends, token, right=True).clamp_(max=num_reqs - 1)
            slot = input_batch.idx_mapping[row]
        max_len = self.slots.max_len
        pos = input_batch.positions[:n].clamp(0, max_len - 1)
        # the (slot, position) pairs as flat rows of the slot tables
        flat = torch.add(pos, slot, alpha=max_len)
        codes, audio = self.slots.codes_by_pos, self.slots.audio_at_pos
        model.audio_codes[:n].copy_(codes.view(-1, codes.shape[-1]).index_select(0, flat))
        model.audio_mask[:n].copy_(audio.view(-1).index_select(0, flat))
        model.audio_mask[n:n_pad] = False
        return out

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        cast(Any, self.model).audio_mask[:num_tokens] = False
        return super().prepare_dummy_inputs(num_reqs, num_tokens)

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any]:
        return HiggsCodeSampler(sampler, self), None

    # -- sampling --------------------------------------------------------------

    def sample(self, logits: torch.Tensor, input_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample rows for the batch: the token each request takes and whether
        the row was a real step, both ``[B]`` (see :meth:`TalkerSlots.step`).
        Everything up to the row copy-out runs on the device; the host only
        routes rows to their destinations."""
        if not self._warm:
            # The first call is vLLM's start-up profiling run: the codec and the
            # sampler compile and capture here, into a cache of their own.
            self._warm = True
            with own_compile_cache(plugin_compile_cache()):
                if self.audio is not None:
                    self.audio.warm_up()
                return self._sample(logits, input_batch)
        return self._sample(logits, input_batch)

    def _sample(self, logits: torch.Tensor, input_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        b = input_batch.num_reqs
        logits = logits[:b]
        slots = input_batch.idx_mapping[:b]
        seq_lens = input_batch.seq_lens[:b]
        out = self._graphs(logits, slots, seq_lens) if self._graphs is not None else None
        if out is None:
            out = self.slots.step(logits, slots.long(), seq_lens.long())
        tokens, real, packed = out
        slots_np = input_batch.idx_mapping_np[:b].tolist()
        row_args = self._row_args_of_slot
        self.publisher.publish_packed(packed, [row_args[s] for s in slots_np])
        if self.audio is not None:
            audio_keys = self._audio_key_of_slot
            self.audio.after_step(packed, [audio_keys[s] for s in slots_np])
        return tokens, real

    def _route(self, slot: int, args: TalkerArgs | None) -> None:
        """Route the slot's rows by ``args`` from the next step (None: nowhere)."""
        audio = args is not None and bool(args.chunking)
        self._audio_key_of_slot[slot] = args.correlation_id if audio and args else None
        self._row_args_of_slot[slot] = args if args is not None and args.chunking is None else None


def decode_thread_option(codec_options: dict[str, Any]) -> bool:
    """``additional_config["higgs_codec"]["decode_thread"]``: large steps' audio
    decoded on the watcher thread (:class:`VllmAudio`; an experiment, off)."""
    value = codec_options.get("decode_thread", False)
    if not isinstance(value, bool):
        raise ValueError(f'higgs_codec["decode_thread"] must be true or false; got {value!r}')
    return value


def gemm_channels_option(codec_options: dict[str, Any]) -> GemmChannels:
    """``additional_config["higgs_codec"]["gemm_channels"]``: the codec's
    convolutions over at least this many input channels run as matrix products
    (:class:`~realtime_engine.codec.causal.CausalDac`); 0: none do; unset or
    ``"auto"``: by the weights' type (products for a float16 codec,
    :func:`~realtime_engine.codec.causal.resolve_gemm_channels`)."""
    value = codec_options.get("gemm_channels")
    if value is None or value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f'higgs_codec["gemm_channels"] must be "auto", 0 (none) or a whole number of'
            f" channels; got {value!r}"
        )
    return value or None


def gemm_taps_option(codec_options: dict[str, Any]) -> GemmTaps:
    """``additional_config["higgs_codec"]["gemm_taps"]``: how the codec's matrix
    products take their taps, ``"shifted"`` (when unset) or ``"gathered"``
    (:class:`~realtime_engine.codec.causal.CausalDac`)."""
    value = codec_options.get("gemm_taps", DEFAULT_GEMM_TAPS)
    if value not in GEMM_TAPS_VALUES:
        raise ValueError(
            f'higgs_codec["gemm_taps"] must be one of {GEMM_TAPS_VALUES}; got {value!r}'
        )
    return cast(GemmTaps, value)


def frames_per_call_option(codec_options: dict[str, Any]) -> int:
    """``additional_config["higgs_codec"]["frames_per_call"]``: the most frames a slot
    steps in one codec call, a power of two up to 8
    (:data:`~realtime_engine.format.DEFAULT_CODEC_FRAMES_PER_CALL` when unset)."""
    value = codec_options.get("frames_per_call", DEFAULT_CODEC_FRAMES_PER_CALL)
    try:
        frame_counts(value)
    except ValueError as e:
        raise ValueError(f'higgs_codec["frames_per_call"]: {e}') from None
    return int(value)


def fused_units_option(codec_options: dict[str, Any]) -> FusedUnitsOption:
    """``additional_config["higgs_codec"]["fused_units"]``: the codec's residual units
    of up to 64 channels as one Triton kernel each
    (:func:`~realtime_engine.codec.fused_unit.fused_residual`), after their first
    activation (true) or taking it too (``"activation"``); ``"narrow"``: so, and
    each block of up to 128 input channels starts with its activation and
    transposed convolution as one kernel
    (:func:`~realtime_engine.codec.fused_upsample.fused_upsample`), and the output
    layer is one too (:func:`~realtime_engine.codec.fused_output.fused_output`);
    unset or ``"auto"``: ``"narrow"`` on CUDA, none elsewhere
    (:func:`~realtime_engine.codec.fused_unit.resolve_fused_units`)."""
    value = codec_options.get("fused_units", DEFAULT_FUSED_UNITS)
    allowed_values: tuple[FusedUnitsOption, ...] = (*FUSED_UNITS_VALUES, "auto")
    for allowed in allowed_values:  # (1 == True: compare types too)
        if type(value) is type(allowed) and value == allowed:
            return allowed
    raise ValueError(
        f'higgs_codec["fused_units"] must be "auto", true, false, "activation" or "narrow";'
        f" got {value!r}"
    )


def switch_interval_option(codec_options: dict[str, Any]) -> float | None:
    """``additional_config["higgs_codec"]["switch_interval_ms"]``: the interpreter's
    switch interval in the engine core, in milliseconds (None: Python's, 5 ms).
    Shorter, the chunk sender and the first-chunk watcher get the interpreter's
    lock sooner beside a busy engine thread (``bench/gil_handoff.py``); an
    experiment until served."""
    value = codec_options.get("switch_interval_ms")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.05 <= value <= 100:
        raise ValueError(
            f'higgs_codec["switch_interval_ms"] must be a number from 0.05 to 100; got {value!r}'
        )
    return float(value)


def plugin_compile_cache() -> Path | None:
    """Where the codec's and the sampler's compiles cache their code: under vLLM's
    cache root, one folder for every engine configuration (None where vLLM's compile
    cache is turned off; :func:`~realtime_engine.talker.compile_workers.own_compile_cache`)."""
    from vllm import envs

    if envs.VLLM_DISABLE_COMPILE_CACHE:
        return None
    return Path(envs.VLLM_CACHE_ROOT) / "higgs_audio_v3" / "torch_compile_cache"


def sampler_compiled(vllm_config: VllmConfig) -> bool:
    """Whether the code sampler goes through torch.compile before its graphs are
    captured (``additional_config["higgs_sampler"]["compiled"]``, default True)."""
    extra = vllm_config.additional_config
    options = (extra.get(SAMPLER_CONFIG_KEY) if isinstance(extra, dict) else None) or {}
    compiled = options.get("compiled", True)
    if not isinstance(compiled, bool):
        key = f'{SAMPLER_CONFIG_KEY}["compiled"]'
        raise ValueError(f"{key} must be true or false; got {compiled!r}")
    return compiled


def _is_first_rank(vllm_config: VllmConfig) -> bool:
    """Only one tensor-parallel rank sends rows (every rank samples the same ones:
    the noise is a function of seed and step, so ranks agree without talking)."""
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError("the Higgs talker does not support pipeline parallelism")
    if vllm_config.parallel_config.tensor_parallel_size == 1:
        return True
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return bool(get_tensor_model_parallel_rank() == 0)


def data_parallel_rank(vllm_config: VllmConfig) -> int:
    """This engine core's data-parallel rank.

    vLLM runs the ranks of a dense model as independent engines and resets
    ``data_parallel_rank`` to 0 in each (``reconfigure_for_independent_dp_rank``);
    the original rank stays in ``data_parallel_index`` (vLLM 0.32; older
    releases keep it in ``data_parallel_rank``).
    """
    parallel = vllm_config.parallel_config
    index = getattr(parallel, "data_parallel_index", None)
    return int(index if index is not None else parallel.data_parallel_rank)


# The fields this vLLM's SamplerOutput has (releases differ), looked up once.
_SAMPLER_OUTPUT_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplerOutput))


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
        return SamplerOutput(**{k: v for k, v in values.items() if k in _SAMPLER_OUTPUT_FIELDS})
