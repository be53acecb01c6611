"""Flux state dicts between diffusers' ``FluxTransformer2DModel`` names and BFL/mxcheck names.

Same maths, different split (research notes A.3): diffusers keeps q, k, v and the
single block's MLP input as separate linears where BFL fuses them (``qkv``, ``linear1``),
and its final ``AdaLayerNormContinuous`` chunks (scale, shift) where BFL's ``LastLayer``
chunks (shift, scale), so that layer's halves are swapped. Every name below was checked
against diffusers 0.42.1 ``models/transformers/transformer_flux.py``,
``models/normalization.py`` and ``models/embeddings.py``.

Only tensors are mapped: this module does not import diffusers. Renamed tensors are the
input tensors themselves; fused, split and swapped ones are new tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mxcheck.flux.config import FluxConfig, get_config

__all__ = ["DIFFUSERS_FIXED", "diffusers_config", "from_diffusers", "to_diffusers"]

# FluxConfig fields that diffusers hard-codes, with the only value it can express:
# Timesteps(num_channels=256) in Combined*TextProjEmbeddings (embeddings.py), FeedForward's
# default mult=4 and FluxSingleTransformerBlock's default mlp_ratio=4.0, FluxPosEmbed(theta=10000)
# and FluxAttention(bias=True) in both blocks (transformer_flux.py).
DIFFUSERS_FIXED: dict[str, object] = {"timestep_dim": 256, "mlp_ratio": 4.0, "theta": 10_000,
                                      "qkv_bias": True}

# BFL module -> diffusers module(s); several are concatenated along the output dim, in order.
_TOP = {
    "img_in": ("x_embedder",),
    "txt_in": ("context_embedder",),
    "time_in.in_layer": ("time_text_embed.timestep_embedder.linear_1",),
    "time_in.out_layer": ("time_text_embed.timestep_embedder.linear_2",),
    "vector_in.in_layer": ("time_text_embed.text_embedder.linear_1",),
    "vector_in.out_layer": ("time_text_embed.text_embedder.linear_2",),
    "final_layer.linear": ("proj_out",),
    "final_layer.adaLN_modulation.1": ("norm_out.linear",),  # halves swapped, see _SWAPPED
}
_GUIDANCE = {
    "guidance_in.in_layer": ("time_text_embed.guidance_embedder.linear_1",),
    "guidance_in.out_layer": ("time_text_embed.guidance_embedder.linear_2",),
}
_DOUBLE = {  # double_blocks.N.<key> <- transformer_blocks.N.<value>
    "img_mod.lin": ("norm1.linear",),
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn.proj": ("attn.to_out.0",),
    "img_mlp.0": ("ff.net.0.proj",),
    "img_mlp.2": ("ff.net.2",),
    "txt_mod.lin": ("norm1_context.linear",),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn.proj": ("attn.to_add_out",),
    "txt_mlp.0": ("ff_context.net.0.proj",),
    "txt_mlp.2": ("ff_context.net.2",),
}
_DOUBLE_NORMS = {  # QK RMSNorm: BFL ``scale``, torch.nn.RMSNorm ``weight``
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
}
_SINGLE = {  # single_blocks.N.<key> <- single_transformer_blocks.N.<value>
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    # proj_out's input is cat([attn, mlp]) as linear2's is (transformer_flux.py), so a rename
    "linear2": ("proj_out",),
    "modulation.lin": ("norm.linear",),
}
_SINGLE_NORMS = {
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
}
_SWAPPED = {"final_layer.adaLN_modulation.1"}


@dataclass(frozen=True)
class _Pair:
    """One BFL tensor and the diffusers tensors it is made of."""

    bfl: str
    diffusers: tuple[str, ...]  # concatenated along dim 0 in this order
    sizes: tuple[int, ...] = ()  # dim-0 size of each part, where parts are joined or swapped
    swap: bool = False           # (shift, scale) halves <-> (scale, shift)

    @property
    def renamed(self) -> bool:
        return len(self.diffusers) == 1 and not self.swap


def _pairs(c: FluxConfig) -> Iterator[_Pair]:
    rows = {"proj_mlp": c.mlp_hidden, "norm_out.linear": 2 * c.hidden_size}

    def linears(bfl: str, prefix: str, parts: tuple[str, ...]) -> Iterator[_Pair]:
        swap = bfl in _SWAPPED
        sizes = tuple(rows.get(p, c.hidden_size) for p in parts) if len(parts) > 1 or swap else ()
        for leaf in ("weight", "bias"):
            yield _Pair(f"{bfl}.{leaf}", tuple(f"{prefix}{p}.{leaf}" for p in parts), sizes, swap)

    top = {**_TOP, **(_GUIDANCE if c.guidance_embed else {})}
    for bfl, parts in top.items():
        yield from linears(bfl, "", parts)
    for n in range(c.depth):
        for bfl, parts in _DOUBLE.items():
            yield from linears(f"double_blocks.{n}.{bfl}", f"transformer_blocks.{n}.", parts)
        for bfl, name in _DOUBLE_NORMS.items():
            yield _Pair(f"double_blocks.{n}.{bfl}", (f"transformer_blocks.{n}.{name}",))
    for n in range(c.depth_single_blocks):
        for bfl, parts in _SINGLE.items():
            yield from linears(f"single_blocks.{n}.{bfl}", f"single_transformer_blocks.{n}.", parts)
        for bfl, name in _SINGLE_NORMS.items():
            yield _Pair(f"single_blocks.{n}.{bfl}", (f"single_transformer_blocks.{n}.{name}",))


def _check_expressible(c: FluxConfig) -> None:
    for field, needed in DIFFUSERS_FIXED.items():
        if getattr(c, field) != needed:
            raise ValueError(f"config {c.name!r}: {field}={getattr(c, field)!r}, but diffusers' "
                             f"FluxTransformer2DModel fixes {field}={needed!r}; use "
                             f"config.with_({field}={needed!r})")


def _check_keys(state_dict: Mapping[str, Tensor], expected: set[str], fn: str, c: FluxConfig,
                layout: str) -> None:
    missing, unexpected = sorted(expected - state_dict.keys()), sorted(state_dict.keys() - expected)
    if not (missing or unexpected):
        return

    def show(keys: list[str]) -> str:
        return ", ".join(keys[:10]) + (f", ... ({len(keys) - 10} more)" if len(keys) > 10 else "")

    raise ValueError(f"{fn}: state_dict does not match config {c.name!r}: {len(missing)} missing "
                     f"[{show(missing)}], {len(unexpected)} unexpected [{show(unexpected)}]; "
                     f"pass the state dict of {layout} for this config")


def _swap_halves(t: Tensor) -> Tensor:
    a, b = t.chunk(2, dim=0)
    return torch.cat((b, a), dim=0)


def _check_rows(name: str, t: Tensor, rows: int) -> None:
    if t.shape[0] != rows:
        raise ValueError(f"state_dict[{name!r}] has shape {tuple(t.shape)}; expected {rows} rows "
                         "for this config")


def from_diffusers(state_dict: Mapping[str, Tensor], config: FluxConfig | str) -> dict[str, Tensor]:
    """A diffusers ``FluxTransformer2DModel`` state dict under mxcheck ``Flux`` (BFL) names.

    Raises ValueError listing missing and unexpected keys, so no tensor is silently dropped.
    """
    c = get_config(config)
    _check_expressible(c)
    pairs = list(_pairs(c))
    _check_keys(state_dict, {d for p in pairs for d in p.diffusers}, "from_diffusers", c,
                "FluxTransformer2DModel(**diffusers_config(config))")
    out: dict[str, Tensor] = {}
    for p in pairs:
        parts = [state_dict[name] for name in p.diffusers]
        if p.renamed:
            out[p.bfl] = parts[0]
            continue
        for name, t, rows in zip(p.diffusers, parts, p.sizes, strict=True):
            _check_rows(name, t, rows)
        fused = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        out[p.bfl] = _swap_halves(fused) if p.swap else fused
    return out


def to_diffusers(state_dict: Mapping[str, Tensor], config: FluxConfig | str) -> dict[str, Tensor]:
    """An mxcheck ``Flux`` (BFL-named) state dict under diffusers ``FluxTransformer2DModel`` names;
    the exact inverse of ``from_diffusers``."""
    c = get_config(config)
    _check_expressible(c)
    pairs = list(_pairs(c))
    _check_keys(state_dict, {p.bfl for p in pairs}, "to_diffusers", c, "mxcheck Flux(config)")
    out: dict[str, Tensor] = {}
    for p in pairs:
        t = state_dict[p.bfl]
        if p.renamed:
            out[p.diffusers[0]] = t
            continue
        _check_rows(p.bfl, t, sum(p.sizes))
        if p.swap:
            t = _swap_halves(t)
        # clone: split gives views of one storage, which safetensors refuses to save
        parts = [x.clone() for x in t.split(list(p.sizes), dim=0)] if len(p.sizes) > 1 else [t]
        out.update(zip(p.diffusers, parts, strict=True))
    return out


def diffusers_config(config: FluxConfig | str) -> dict[str, object]:
    """Keyword arguments of ``FluxTransformer2DModel(**kwargs)`` for a FluxConfig.

    Raises ValueError for a field diffusers hard-codes to another value (``DIFFUSERS_FIXED``).
    """
    c = get_config(config)
    _check_expressible(c)
    return {
        "patch_size": 1,  # BFL patchifies outside the transformer: in_channels is per token
        "in_channels": c.in_channels,
        "out_channels": c.out_channels,
        "num_layers": c.depth,
        "num_single_layers": c.depth_single_blocks,
        "attention_head_dim": c.head_dim,
        "num_attention_heads": c.num_heads,
        "joint_attention_dim": c.context_in_dim,
        "pooled_projection_dim": c.vec_in_dim,
        "guidance_embeds": c.guidance_embed,
        "axes_dims_rope": tuple(c.axes_dim),
    }
