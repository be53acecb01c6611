"""Every Flux linear and the three GEMMs each one runs in training.

``flux_linears`` lists the ``nn.Linear`` modules of the BFL model by checkpoint name with
their widths and the token stream they see; ``flux_linear_shapes`` turns those into NT
GEMM shapes for a batch and token count:

- fwd   ``Y[M,N]  = X[M,K] W[N,K]^T``: M = tokens, N = out_features, K = in_features
- dgrad ``dX[M,N] = dY[M,K] W^T``:      M = tokens, N = in_features,  K = out_features
- wgrad ``dW[M,N] = dY^T X``:           M = out_features, N = in_features, K = tokens

Tokens per stream: ``img`` batch*img_tokens, ``txt`` batch*txt_tokens, ``joint`` (single
blocks, after the [txt, img] concatenation) batch*(img+txt), ``vec`` (modulation and the
embedders of the conditioning vector) batch. ``replaced`` marks what a Primus local spec
quantizes: qkv, proj and both MLP linears of each double-block stream, and the single
blocks' fused linear1 / linear2.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from mxcheck.flux.config import FluxConfig, get_config
from mxcheck.recipes import GEMM_DIRECTIONS
from mxcheck.text import table

__all__ = [
    "GemmShape",
    "LinearInfo",
    "LinearShape",
    "flux_linear_shapes",
    "flux_linears",
    "shapes_csv",
    "shapes_json",
    "shapes_text",
    "unique_gemms",
]


@dataclass(frozen=True)
class LinearInfo:
    """One nn.Linear of the model: checkpoint name, widths, bias, stream, replaced or not."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    stream: str
    replaced: bool


@dataclass(frozen=True)
class GemmShape:
    """An NT GEMM ``out[M,N] = A[M,K] B[N,K]^T`` run by ``layer`` in ``direction``."""

    layer: str
    direction: str
    m: int
    n: int
    k: int

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k


@dataclass(frozen=True)
class LinearShape:
    """A linear at a token count: its forward, dgrad and wgrad GEMMs."""

    linear: LinearInfo
    tokens: int

    @property
    def name(self) -> str:
        return self.linear.name

    def gemm(self, direction: str) -> GemmShape:
        i, o, t = self.linear.in_features, self.linear.out_features, self.tokens
        mnk = {"fwd": (t, o, i), "dgrad": (t, i, o), "wgrad": (o, i, t)}
        if direction not in mnk:
            raise ValueError(f"direction={direction!r}: expected one of {GEMM_DIRECTIONS}")
        return GemmShape(self.name, direction, *mnk[direction])

    def gemms(self) -> tuple[GemmShape, ...]:
        return tuple(self.gemm(d) for d in GEMM_DIRECTIONS)


def _embedder(prefix: str, in_dim: int, hidden: int, stream: str) -> list[LinearInfo]:
    # MLPEmbedder: out_layer(silu(in_layer(x)))
    return [LinearInfo(f"{prefix}.in_layer", in_dim, hidden, True, stream, False),
            LinearInfo(f"{prefix}.out_layer", hidden, hidden, True, stream, False)]


def flux_linears(config: FluxConfig | str) -> list[LinearInfo]:
    """Every nn.Linear of ``Flux(config)``, in module order, with BFL checkpoint names."""
    c = get_config(config)
    h, mlp = c.hidden_size, c.mlp_hidden
    rows = [LinearInfo("img_in", c.in_channels, h, True, "img", False)]
    rows += _embedder("time_in", c.timestep_dim, h, "vec")
    rows += _embedder("vector_in", c.vec_in_dim, h, "vec")
    if c.guidance_embed:
        rows += _embedder("guidance_in", c.timestep_dim, h, "vec")
    rows.append(LinearInfo("txt_in", c.context_in_dim, h, True, "txt", False))
    for i in range(c.depth):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}"
            rows += [
                LinearInfo(f"{p}_mod.lin", h, 6 * h, True, "vec", False),
                LinearInfo(f"{p}_attn.qkv", h, 3 * h, c.qkv_bias, s, True),
                LinearInfo(f"{p}_attn.proj", h, h, True, s, True),
                LinearInfo(f"{p}_mlp.0", h, mlp, True, s, True),
                LinearInfo(f"{p}_mlp.2", mlp, h, True, s, True),
            ]
    for i in range(c.depth_single_blocks):
        p = f"single_blocks.{i}"
        rows += [
            LinearInfo(f"{p}.linear1", h, 3 * h + mlp, True, "joint", True),
            LinearInfo(f"{p}.linear2", h + mlp, h, True, "joint", True),
            LinearInfo(f"{p}.modulation.lin", h, 3 * h, True, "vec", False),
        ]
    rows += [LinearInfo("final_layer.linear", h, c.out_channels, True, "img", False),
             LinearInfo("final_layer.adaLN_modulation.1", h, 2 * h, True, "vec", False)]
    return rows


def _stream_tokens(batch: int, img_tokens: int, txt_tokens: int) -> dict[str, int]:
    for arg, value in (("batch", batch), ("img_tokens", img_tokens), ("txt_tokens", txt_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg}={value!r}: expected a positive int")
    return {"img": batch * img_tokens, "txt": batch * txt_tokens,
            "joint": batch * (img_tokens + txt_tokens), "vec": batch}


def flux_linear_shapes(config: FluxConfig | str, batch: int, img_tokens: int, txt_tokens: int,
                       *, replaced_only: bool = True) -> list[LinearShape]:
    """Each (replaced, by default) linear with its token count; ``.gemms()`` gives its GEMMs.

    At batch 64 with 256 image + 256 text tokens the double-stream GEMMs have M = 16384 and
    the single-stream ones M = 32768.
    """
    tokens = _stream_tokens(batch, img_tokens, txt_tokens)
    return [LinearShape(info, tokens[info.stream]) for info in flux_linears(config)
            if info.replaced or not replaced_only]


def unique_gemms(shapes: list[LinearShape]) -> dict[tuple[str, int, int, int], list[str]]:
    """(direction, M, N, K) -> the layers that run it, in first-seen order."""
    out: dict[tuple[str, int, int, int], list[str]] = {}
    for row in shapes:
        for g in row.gemms():
            out.setdefault((g.direction, *g.mnk), []).append(g.layer)
    return out


def shapes_csv(shapes: list[LinearShape]) -> str:
    """One row per layer and direction: layer,stream,direction,M,N,K."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["layer", "stream", "direction", "M", "N", "K"])
    for row in shapes:
        for g in row.gemms():
            writer.writerow([g.layer, row.linear.stream, g.direction, g.m, g.n, g.k])
    return buf.getvalue()


def shapes_json(shapes: list[LinearShape]) -> list[dict[str, object]]:
    """One JSON object per layer and direction: layer, stream, direction, m, n, k."""
    return [{"layer": g.layer, "stream": row.linear.stream, "direction": g.direction,
             "m": g.m, "n": g.n, "k": g.k} for row in shapes for g in row.gemms()]


def shapes_text(shapes: list[LinearShape]) -> str:
    """How many linears and unique GEMMs, then a table of the unique GEMMs."""
    unique = unique_gemms(shapes)
    rows = [["direction", "M", "N", "K", "layers"]]
    rows += [[d, str(m), str(n), str(k), f"{len(names)} ({names[0]}...)"]
             for (d, m, n, k), names in unique.items()]
    return f"{len(shapes)} linears, {len(unique)} unique GEMMs\n{table(rows)}"
