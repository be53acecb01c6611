"""Flux transformer in plain PyTorch, following BFL ``src/flux/{model,modules/layers,math}.py``.

Parameter names are the original checkpoint's (``img_in``, ``time_in.in_layer``,
``double_blocks.N.img_attn.qkv``, ``single_blocks.N.linear1``,
``final_layer.adaLN_modulation.1``, ...), so a BFL state dict loads with ``strict=True``.
The maths is BFL's: tanh-GELU MLPs, QK RMSNorm with a learnable ``scale`` (computed in
float32), interleaved RoPE on (B, L, 3) position ids, joint attention over [txt, img],
adaLN modulation ``(1 + scale) * LN(x) + shift`` with gated residuals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mxcheck.flux.config import FluxConfig, get_config

__all__ = ["Flux", "apply_rope", "rope", "timestep_embedding"]


def timestep_embedding(t: Tensor, dim: int, max_period: int = 10_000, time_factor: float = 1000.0) -> Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled by 1000), cos half first (BFL)."""
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb.to(t) if torch.is_floating_point(t) else emb


def rope(pos: Tensor, dim: int, theta: int) -> Tensor:
    """(B, L) positions -> (B, L, dim/2, 2, 2) rotation matrices [[cos, -sin], [sin, cos]]."""
    scale = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    omega = 1.0 / (theta**scale)
    angles = pos.to(torch.float64)[..., None] * omega
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*angles.shape, 2, 2).float()


def apply_rope(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate adjacent pairs (x[2j], x[2j+1]): the interleaved convention."""
    def rotate(x: Tensor) -> Tensor:
        x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
        out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
        return out.reshape(*x.shape).type_as(x)

    return rotate(xq), rotate(xk)


def attention(q: Tensor, k: Tensor, v: Tensor, pe: Tensor) -> Tensor:
    q, k = apply_rope(q, k, pe)
    x = F.scaled_dot_product_attention(q, k, v)
    b, h, seq, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, seq, h * d)


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """``B L (K H D) -> K B H L D`` with K = 3."""
    b, seq, width = qkv.shape
    q, k, v = qkv.reshape(b, seq, 3, num_heads, width // (3 * num_heads)).permute(2, 0, 3, 1, 4)
    return q, k, v


class EmbedND(nn.Module):
    def __init__(self, theta: int, axes_dim: tuple[int, ...]) -> None:
        super().__init__()
        self.theta, self.axes_dim = theta, axes_dim

    def forward(self, ids: Tensor) -> Tensor:
        emb = torch.cat([rope(ids[..., i], d, self.theta) for i, d in enumerate(self.axes_dim)], dim=-3)
        return emb.unsqueeze(1)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.in_layer = nn.Linear(in_dim, hidden_dim, bias=True)
        self.silu = nn.SiLU()
        self.out_layer = nn.Linear(hidden_dim, hidden_dim, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(self.silu(self.in_layer(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x_dtype = x.dtype
        x = x.float()
        rrms = torch.rsqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-6)
        return (x * rrms).to(dtype=x_dtype) * self.scale


class QKNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = nn.Linear(dim, dim)


@dataclass
class ModulationOut:
    shift: Tensor
    scale: Tensor
    gate: Tensor


class Modulation(nn.Module):
    def __init__(self, dim: int, double: bool) -> None:
        super().__init__()
        self.is_double = double
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim, bias=True)

    def forward(self, vec: Tensor) -> tuple[ModulationOut, ModulationOut | None]:
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return ModulationOut(*out[:3]), ModulationOut(*out[3:]) if self.is_double else None


def _mlp(hidden: int, mlp_hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden, mlp_hidden, bias=True), nn.GELU(approximate="tanh"),
                         nn.Linear(mlp_hidden, hidden, bias=True))


def _modulate(norm: nn.Module, x: Tensor, mod: ModulationOut) -> Tensor:
    return (1 + mod.scale) * norm(x) + mod.shift


class DoubleStreamBlock(nn.Module):
    def __init__(self, c: FluxConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.num_heads = c.num_heads
        for stream in ("img", "txt"):  # registration order = BFL module order
            setattr(self, f"{stream}_mod", Modulation(h, double=True))
            setattr(self, f"{stream}_norm1", nn.LayerNorm(h, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{stream}_attn", SelfAttention(h, c.num_heads, c.qkv_bias))
            setattr(self, f"{stream}_norm2", nn.LayerNorm(h, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{stream}_mlp", _mlp(h, c.mlp_hidden))

    def _qkv(self, stream: str, x: Tensor, mod: ModulationOut) -> tuple[Tensor, Tensor, Tensor]:
        attn: SelfAttention = getattr(self, f"{stream}_attn")
        q, k, v = split_heads(attn.qkv(_modulate(getattr(self, f"{stream}_norm1"), x, mod)), self.num_heads)
        q, k = attn.norm(q, k, v)
        return q, k, v

    def _residual(self, stream: str, x: Tensor, attn_out: Tensor, mod1: ModulationOut,
                  mod2: ModulationOut) -> Tensor:
        x = x + mod1.gate * getattr(self, f"{stream}_attn").proj(attn_out)
        return x + mod2.gate * getattr(self, f"{stream}_mlp")(
            _modulate(getattr(self, f"{stream}_norm2"), x, mod2))

    def forward(self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor) -> tuple[Tensor, Tensor]:
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)
        img_q, img_k, img_v = self._qkv("img", img, img_mod1)
        txt_q, txt_k, txt_v = self._qkv("txt", txt, txt_mod1)
        # joint attention over [txt, img]
        attn = attention(torch.cat((txt_q, img_q), dim=2), torch.cat((txt_k, img_k), dim=2),
                         torch.cat((txt_v, img_v), dim=2), pe)
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1]:]
        img = self._residual("img", img, img_attn, img_mod1, img_mod2)
        txt = self._residual("txt", txt, txt_attn, txt_mod1, txt_mod2)
        return img, txt


class SingleStreamBlock(nn.Module):
    """Parallel attention + MLP with fused input (linear1) and output (linear2) linears."""

    def __init__(self, c: FluxConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.hidden_size, self.num_heads, self.mlp_hidden_dim = h, c.num_heads, c.mlp_hidden
        self.linear1 = nn.Linear(h, h * 3 + c.mlp_hidden)
        self.linear2 = nn.Linear(h + c.mlp_hidden, h)
        self.norm = QKNorm(c.head_dim)
        self.pre_norm = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(h, double=False)

    def forward(self, x: Tensor, vec: Tensor, pe: Tensor) -> Tensor:
        mod, _ = self.modulation(vec)
        qkv, mlp = torch.split(self.linear1(_modulate(self.pre_norm, x, mod)),
                               [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        q, k, v = split_heads(qkv, self.num_heads)
        q, k = self.norm(q, k, v)
        out = self.linear2(torch.cat((attention(q, k, v, pe), self.mlp_act(mlp)), 2))
        return x + mod.gate * out


class LastLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden, bias=True))

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)  # BFL order: (shift, scale)
        return self.linear((1 + scale[:, None, :]) * self.norm_final(x) + shift[:, None, :])


class Flux(nn.Module):
    """``Flux(config)(img, img_ids, txt, txt_ids, timesteps, y, guidance=None)`` -> (B, L_img, out)."""

    def __init__(self, config: FluxConfig | str) -> None:
        super().__init__()
        c = self.config = get_config(config)
        h = c.hidden_size
        self.pe_embedder = EmbedND(c.theta, c.axes_dim)
        self.img_in = nn.Linear(c.in_channels, h, bias=True)
        self.time_in = MLPEmbedder(c.timestep_dim, h)
        self.vector_in = MLPEmbedder(c.vec_in_dim, h)
        self.guidance_in = MLPEmbedder(c.timestep_dim, h) if c.guidance_embed else nn.Identity()
        self.txt_in = nn.Linear(c.context_in_dim, h)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(c) for _ in range(c.depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(c) for _ in range(c.depth_single_blocks))
        self.final_layer = LastLayer(h, c.out_channels)

    def forward(self, img: Tensor, img_ids: Tensor, txt: Tensor, txt_ids: Tensor, timesteps: Tensor,
                y: Tensor, guidance: Tensor | None = None) -> Tensor:
        c = self.config
        if img.ndim != 3 or txt.ndim != 3:
            raise ValueError(f"img and txt must be (B, L, C), got img {tuple(img.shape)}, txt {tuple(txt.shape)}")
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, c.timestep_dim))
        if c.guidance_embed:
            if guidance is None:
                raise ValueError(f"config {c.name} embeds guidance: pass guidance (B,) strengths")
            vec = vec + self.guidance_in(timestep_embedding(guidance, c.timestep_dim))
        vec = vec + self.vector_in(y)
        txt = self.txt_in(txt)
        pe = self.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        for block in self.double_blocks:
            img, txt = block(img, txt, vec, pe)
        x = torch.cat((txt, img), 1)
        for block in self.single_blocks:
            x = block(x, vec, pe)
        return self.final_layer(x[:, txt.shape[1]:, ...], vec)
