"""Qwen3 decoder math for the talker: RMSNorm, rotate-half RoPE, GQA attention, SiLU MLP.

Written as small functions plus thin modules so other backends can check
their own layers against them. Parameter names follow the checkpoint
(``layers.N.self_attn.q_proj.weight``...) so loading is a prefix rename.

Attention runs per request over that request's own :class:`KVCache`, which
is what lets one decode step hold requests of different lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from realtime_engine.model.config import HiggsTalkerConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back (as Qwen3 does)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[..., head_dim]`` for integer ``positions``.

    Computed in float32, then rounded to the model dtype: in bfloat16 that is
    the rounding the released model was run with.
    """
    inv_freq = 1.0 / (
        theta
        ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; ``x`` is ``[heads, S, head_dim]``, cos/sin ``[S, head_dim]``."""
    return x * cos + rotate_half(x) * sin


class KVCache:
    """Keys and values of one request, per layer, growing along the sequence.

    Storage is preallocated and doubled when full so a decode step appends in
    place instead of copying the whole history. ``length`` counts the positions
    already written (and is the RoPE position of the next token).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        initial_capacity: int = 256,
    ) -> None:
        self.num_layers = num_layers
        self.length = 0
        self._capacity = max(1, initial_capacity)
        shape = (num_kv_heads, self._capacity, head_dim)
        self._keys = [torch.empty(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self._values = [torch.empty(shape, device=device, dtype=dtype) for _ in range(num_layers)]

    @classmethod
    def for_config(
        cls,
        config: HiggsTalkerConfig,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        initial_capacity: int = 256,
    ) -> KVCache:
        return cls(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.head_dim,
            device=device,
            dtype=dtype,
            initial_capacity=initial_capacity,
        )

    def _grow(self, needed: int) -> None:
        capacity = self._capacity
        while capacity < needed:
            capacity *= 2
        for store in (self._keys, self._values):
            for i, old in enumerate(store):
                new = old.new_empty((old.shape[0], capacity, old.shape[2]))
                new[:, : self.length] = old[:, : self.length]
                store[i] = new
        self._capacity = capacity

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``/``v`` ``[kv_heads, S, head_dim]`` at ``length``; return the whole history.

        ``length`` itself moves in :meth:`advance`, once every layer has written.
        """
        end = self.length + k.shape[1]
        if end > self._capacity:
            self._grow(end)
        self._keys[layer][:, self.length : end] = k
        self._values[layer][:, self.length : end] = v
        return self._keys[layer][:, :end], self._values[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def keys(self, layer: int) -> torch.Tensor:
        return self._keys[layer][:, : self.length]

    def values(self, layer: int) -> torch.Tensor:
        return self._values[layer][:, : self.length]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Attention of ``q`` ``[H, S, hd]`` at positions ``start..start+S-1``.

    Keys and values are ``[KVH, L, hd]``.

    ``L == start + S``: the cache already holds the new keys. Grouped-query
    heads share their kv head.
    """
    num_q, seq = q.shape[0], q.shape[1]
    group = num_q // k.shape[0]
    if group > 1:
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
    if seq == 1:
        return F.scaled_dot_product_attention(q, k, v)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    query_pos = torch.arange(start, start + seq, device=q.device)[:, None]
    key_pos = torch.arange(k.shape[1], device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_pos <= query_pos)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Qwen3Attention(nn.Module):
    def __init__(self, config: HiggsTalkerConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd
        self.q_proj = nn.Linear(d, config.q_size, bias=False)
        self.k_proj = nn.Linear(d, config.kv_size, bias=False)
        self.v_proj = nn.Linear(d, config.kv_size, bias=False)
        self.o_proj = nn.Linear(config.q_size, d, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        layer: int,
        caches: Sequence[KVCache],
        rope: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """``x`` ``[B, S, D]``; request ``b`` attends over ``caches[b]`` (written here).

        ``rope[b]`` holds request ``b``'s cos/sin for its ``S`` new positions.
        """
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        # Qwen3 normalises each head's q and k before the rotation.
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        outputs = []
        for b, (cache, (cos, sin)) in enumerate(zip(caches, rope, strict=True)):
            start = cache.length
            k_all, v_all = cache.write(layer, apply_rope(k[b], cos, sin), v[b])
            outputs.append(causal_attention(apply_rope(q[b], cos, sin), k_all, v_all, start))
        attn = torch.stack(outputs).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(attn)


class Qwen3MLP(nn.Module):
    def __init__(self, config: HiggsTalkerConfig) -> None:
        super().__init__()
        d, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: HiggsTalkerConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Qwen3Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        caches: Sequence[KVCache],
        rope: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), self.index, caches, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    """The decoder stack and final norm (checkpoint prefix ``body.``)."""

    def __init__(self, config: HiggsTalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head_dim = config.head_dim
        self.theta = config.rope_theta

    def forward(self, x: torch.Tensor, caches: Sequence[KVCache]) -> torch.Tensor:
        """``x`` ``[B, S, D]`` through every layer and the final norm; appends to ``caches``."""
        if len(caches) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} sequences but {len(caches)} caches")
        seq = x.shape[1]
        rope = [
            rope_cos_sin(
                torch.arange(c.length, c.length + seq, device=x.device),
                self.head_dim,
                self.theta,
                x.dtype,
            )
            for c in caches
        ]
        for layer in self.layers:
            x = layer(x, caches, rope)
        for cache in caches:
            cache.advance(x.shape[1])
        return self.norm(x)
