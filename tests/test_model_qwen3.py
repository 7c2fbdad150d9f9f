"""The talker's Qwen3 math against an independent, straightforward implementation.

The reference below works on the raw checkpoint tensors with explicit loops
and formulas (no code shared with the model), recomputing the whole sequence
at every step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from realtime_engine.model.config import HiggsTalkerConfig
from realtime_engine.model.loader import LoadedTalker, load_talker
from realtime_engine.model.talker import HiggsTalker

ATOL = 1e-5


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint: Path) -> LoadedTalker:
    return load_talker(tiny_checkpoint, with_codec=False)


@pytest.fixture(scope="module")
def weights(tiny_checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(tiny_checkpoint / "model.safetensors"))


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [S, heads, hd]; pair i with i + hd/2, angle pos · theta^(-2i/hd)."""
    seq, _, hd = x.shape
    half = hd // 2
    out = torch.empty_like(x)
    for pos in range(seq):
        for i in range(half):
            angle = pos * theta ** (-2.0 * i / hd)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[pos, :, i], x[pos, :, i + half]
            out[pos, :, i] = a * c - b * s
            out[pos, :, i + half] = b * c + a * s
    return out


def reference_hidden(
    sd: dict[str, torch.Tensor],
    cfg: HiggsTalkerConfig,
    embeds: torch.Tensor,
    *,
    norm_before_rope: bool = True,
) -> torch.Tensor:
    """Final-normed hidden states [S, D] for input embeddings [S, D], full recompute."""
    x = embeds.double()
    sd64 = {k: v.double() for k, v in sd.items()}
    seq = x.shape[0]
    heads, kv_heads, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    for n in range(cfg.num_hidden_layers):
        p = f"body.layers.{n}."
        h = _rms(x, sd64[p + "input_layernorm.weight"], eps)
        q = (h @ sd64[p + "self_attn.q_proj.weight"].T).view(seq, heads, hd)
        k = (h @ sd64[p + "self_attn.k_proj.weight"].T).view(seq, kv_heads, hd)
        v = (h @ sd64[p + "self_attn.v_proj.weight"].T).view(seq, kv_heads, hd)
        qn, kn = sd64[p + "self_attn.q_norm.weight"], sd64[p + "self_attn.k_norm.weight"]
        if norm_before_rope:
            q, k = _rope(_rms(q, qn, eps), cfg.rope_theta), _rope(_rms(k, kn, eps), cfg.rope_theta)
        else:
            q, k = _rms(_rope(q, cfg.rope_theta), qn, eps), _rms(_rope(k, cfg.rope_theta), kn, eps)
        attn = torch.zeros(seq, heads, hd, dtype=torch.float64)
        for head in range(heads):
            kvh = head // (heads // kv_heads)
            scores = (q[:, head] @ k[:, kvh].T) / math.sqrt(hd)
            future = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            attn[:, head] = probs @ v[:, kvh]
        x = x + attn.reshape(seq, -1) @ sd64[p + "self_attn.o_proj.weight"].T
        h = _rms(x, sd64[p + "post_attention_layernorm.weight"], eps)
        gate = h @ sd64[p + "mlp.gate_proj.weight"].T
        up = h @ sd64[p + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ sd64[p + "mlp.down_proj.weight"].T
    return _rms(x, sd64["body.norm.weight"], eps).float()


def _inputs(model: HiggsTalker, seed: int, prompt_len: int, steps: int) -> torch.Tensor:
    """Embeddings of a random text prompt followed by random audio rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g)
    rows = torch.randint(0, 1026, (steps, 8), generator=g)
    with torch.no_grad():
        return torch.cat([model.embed_prompt(ids), model.embed_audio_rows(rows)])


def test_incremental_decode_matches_full_recompute(loaded: LoadedTalker, weights) -> None:
    model = loaded.model
    embeds = _inputs(model, seed=1, prompt_len=9, steps=6)
    expected = reference_hidden(weights, loaded.config, embeds)
    cache = model.new_cache(initial_capacity=4)  # forces the cache to grow mid-run
    with torch.no_grad():
        got = [model.forward_embeds(embeds[None, :9], [cache])[0]]
        for t in range(9, embeds.shape[0]):
            got.append(model.forward_embeds(embeds[None, t : t + 1], [cache])[0])
    assert cache.length == embeds.shape[0]
    torch.testing.assert_close(torch.cat(got), expected, atol=ATOL, rtol=0)


def test_chunked_prefill_matches_full_recompute(loaded: LoadedTalker, weights) -> None:
    model = loaded.model
    embeds = _inputs(model, seed=2, prompt_len=12, steps=0)
    expected = reference_hidden(weights, loaded.config, embeds)
    cache = model.new_cache()
    with torch.no_grad():
        first = model.forward_embeds(embeds[None, :5], [cache])[0]
        second = model.forward_embeds(embeds[None, 5:], [cache])[0]
    torch.testing.assert_close(torch.cat([first, second]), expected, atol=ATOL, rtol=0)


def test_qk_norm_is_applied_before_rope(loaded: LoadedTalker, weights) -> None:
    model = loaded.model
    embeds = _inputs(model, seed=3, prompt_len=8, steps=0)
    with torch.no_grad():
        got = model.forward_embeds(embeds[None], [model.new_cache()])[0]
    swapped = reference_hidden(weights, loaded.config, embeds, norm_before_rope=False)
    # The tiny norm gains are not all equal, so the order is observable.
    assert (got - swapped).abs().max() > 1e-3
    torch.testing.assert_close(
        got, reference_hidden(weights, loaded.config, embeds), atol=ATOL, rtol=0
    )


def _decode_alone(model: HiggsTalker, embeds: torch.Tensor, prompt_len: int) -> torch.Tensor:
    cache = model.new_cache()
    out = [model.forward_embeds(embeds[None, :prompt_len], [cache])[0, -1]]
    for t in range(prompt_len, embeds.shape[0]):
        out.append(model.forward_embeds(embeds[None, t : t + 1], [cache])[0, 0])
    return torch.stack(out)


def test_batched_decode_is_bit_identical_to_single(loaded: LoadedTalker) -> None:
    model = loaded.model
    # Different prompt lengths: the requests sit at different positions.
    lengths = [5, 11, 7]
    steps = 6
    inputs = [_inputs(model, seed=10 + i, prompt_len=n, steps=steps) for i, n in enumerate(lengths)]
    with torch.no_grad():
        alone = [_decode_alone(model, x, n) for x, n in zip(inputs, lengths, strict=True)]
        caches = [model.new_cache() for _ in lengths]
        batched = [
            [model.forward_embeds(x[None, :n], [c])[0, -1]]
            for x, n, c in zip(inputs, lengths, caches, strict=True)
        ]
        for s in range(steps):
            step = torch.stack([x[n + s] for x, n in zip(inputs, lengths, strict=True)])[:, None]
            hidden = model.forward_embeds(step, caches)[:, 0]
            for b in range(len(lengths)):
                batched[b].append(hidden[b])
        logits_batched = model.audio_logits(hidden)
        logits_alone = torch.stack([model.audio_logits(a[-1]) for a in alone])
    for b in range(len(lengths)):
        assert torch.equal(torch.stack(batched[b]), alone[b])
    assert torch.equal(logits_batched, logits_alone)


def test_batched_gemm_mode_stays_close(loaded: LoadedTalker) -> None:
    model = loaded.model
    lengths = [4, 9]
    inputs = [_inputs(model, seed=20 + i, prompt_len=n, steps=3) for i, n in enumerate(lengths)]
    model.batch_invariant = False
    try:
        with torch.no_grad():
            alone = [_decode_alone(model, x, n) for x, n in zip(inputs, lengths, strict=True)]
            caches = [model.new_cache() for _ in lengths]
            for x, n, c in zip(inputs, lengths, caches, strict=True):
                model.forward_embeds(x[None, :n], [c])
            for s in range(3):
                step = torch.stack([x[n + s] for x, n in zip(inputs, lengths, strict=True)])
                hidden = model.forward_embeds(step[:, None], caches)[:, 0]
    finally:
        model.batch_invariant = True
    for b in range(len(lengths)):
        torch.testing.assert_close(hidden[b], alone[b][-1], atol=ATOL, rtol=0)


def test_cache_count_must_match_batch(loaded: LoadedTalker) -> None:
    model = loaded.model
    embeds = torch.zeros(2, 1, model.config.hidden_size)
    with pytest.raises(ValueError, match="2 sequences but 1 caches"):
        model.forward_embeds(embeds, [model.new_cache()])


def test_bfloat16_tracks_float32(tiny_checkpoint: Path, loaded: LoadedTalker) -> None:
    bf16 = load_talker(tiny_checkpoint, dtype=torch.bfloat16, with_codec=False).model
    assert bf16.dtype == torch.bfloat16
    embeds = _inputs(loaded.model, seed=4, prompt_len=6, steps=0)
    with torch.no_grad():
        ref = loaded.model.forward_embeds(embeds[None], [loaded.model.new_cache()])[0]
        low = bf16.forward_embeds(embeds[None].bfloat16(), [bf16.new_cache()])[0]
        logits = bf16.audio_logits(low)
    assert logits.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(low.float(), ref, dim=-1)
    assert cos.min() > 0.98


def test_matches_transformers_qwen3(loaded: LoadedTalker, weights) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the reference Qwen3 implementation (a vLLM dependency)"
    )
    cfg = loaded.config
    hf_cfg = transformers.Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        attention_bias=False,
    )
    hf_cfg._attn_implementation = "eager"
    hf = transformers.Qwen3Model(hf_cfg).eval()
    renamed = {"embed_tokens.weight": weights["tied.embedding.text_embedding.weight"]}
    for key, value in weights.items():
        if key.startswith("body."):
            renamed[key.removeprefix("body.")] = value
    missing, unexpected = hf.load_state_dict(renamed, strict=False)
    assert not [m for m in missing if "rotary" not in m] and not unexpected
    ids = torch.randint(0, cfg.vocab_size, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = hf(input_ids=ids).last_hidden_state[0]
        model = loaded.model
        got = model.forward_embeds(model.embed_prompt(ids[0])[None], [model.new_cache()])[0]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
