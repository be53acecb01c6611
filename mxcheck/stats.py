"""Per-block statistics of a quantized operand (``mxcheck.stats_probe`` gathers them from a
model while it runs).

``block_stats(x, spec)`` quantizes a 2D operand ``[rows, contraction]`` as the spec says
(``mxcheck.gemm.quantize_operand``) and reports, per block and in summary:

- **saturation**: a block saturates when its largest scaled magnitude (amax times the
  quantizer's own encode multiplier, in float32 as the quantizer computes it) exceeds the
  element format's max before rounding, i.e. the quantizer clips it. On Gaussian data the
  OCP ``floor`` rule clips about 30% of MXFP4 blocks and 17% of MXFP8-E4M3 blocks; ``rceil``
  never clips. A clip can be harmless: FP8 current scaling computes ``amax * (max / amax)``
  in float32, which often lands one float32 ulp above max, and NVFP4's rounded ue4m3 block
  scale leaves about half the blocks' amax a little above 6. So **overflow** counts the
  blocks whose scaled amax reaches max + half an ulp of max, where round-to-nearest
  without saturation would leave the format's range: there the clip changed a code.
- **flush to zero**: the fraction of non-zero elements that dequantize to (+-)0.
- **scale exponents**: a histogram of each block's scale binade: MX the E8M0 exponent
  (byte - 127, the dequantization multiplier 2**e); NVFP4 the binade of the ue4m3 block
  scale (the fp32 tensor scale left out; a zero block scale has no binade and is not
  counted); FP8 floor(log2(scale_inv)), the dequantization multiplier.
- **error**: per block ``||dq - x|| / ||x||`` and SNR ``10 log10(sum x^2 / sum (dq - x)^2)``
  (float64) as tensors over the block grid, with quantiles and an SNR histogram.

A *block* is a scale group, the elements that share one scale, so every statistic uses
one geometry: MX 1 x block_size along the last axis (block_size x block_size tiles with
``block_2d``); NVFP4 1 x 16 (16 x 16 tiles); FP8 the whole tensor (``tensor``, ``delayed``:
one block), one row (``row``), 1 x 128 or 128 x 128. Blocks whose elements are all zero
(padding among them) or whose amax is NaN are counted apart and left out of every fraction,
histogram and quantile (their error tensors hold NaN).

Statistics are taken on what the quantizer consumed: with ``pad_to`` the zero-padded
operand, and with a Hadamard the *rotated* operand (the codes hold it, and saturation and
flushing happen there), compared with the dequantized codes without undoing the rotation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from mxcheck.formats import FORMATS, decode, get_format
from mxcheck.gemm import PlainTensor, QTensor, quantize_operand
from mxcheck.hadamard import apply_hadamard
from mxcheck.metrics import snr_db
from mxcheck.recipes import OperandSpec
from mxcheck.scaling import DelayedScaling, FP8Tensor, MXTensor, NVFP4Tensor
from mxcheck.scaling.blocks import block_amax
from mxcheck.scaling.fp8 import FP8_GRANULARITIES
from mxcheck.scaling.mx import e8m0_reciprocal
from mxcheck.scaling.nvfp4 import NVFP4_BLOCK, _global_encode_scale
from mxcheck.text import table

__all__ = ["DISTRIBUTIONS", "QUANTILES", "BlockStats", "block_stats", "synthetic"]

QUANTILES = {"min": 0.0, "p1": 0.01, "p5": 0.05, "p50": 0.5, "p95": 0.95, "p99": 0.99, "max": 1.0}
_FLT_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True, eq=False)
class BlockStats:
    """Per-block statistics of one quantized operand (see the module docstring)."""

    fmt: str
    scaling: str
    shape: tuple[int, int]  # the operand as given
    block: tuple[int, int]  # rows x cols of one block (a scale group)
    domain: str  # "input", or "rotated" with a Hadamard
    n_blocks: int
    zero_blocks: int
    nan_blocks: int
    saturated_blocks: int
    saturated_fraction: float  # of the non-zero, non-NaN blocks
    overflow_blocks: int
    overflow_fraction: float
    nonzero_elements: int
    flushed_elements: int
    flushed_fraction: float  # of the non-zero elements
    scale_exponents: dict[int, int]
    snr_db: float  # the whole operand
    exact_blocks: int  # zero error: SNR inf, not in snr_histogram
    snr_histogram: dict[int, int]  # floor(block SNR dB) -> count
    rel_error_quantiles: dict[str, float]
    snr_db_quantiles: dict[str, float]
    block_rel_error: torch.Tensor  # float64, the block grid
    block_snr_db: torch.Tensor

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (no tensors): histogram keys as strings, non-finite floats as
        "inf"/"-inf"/"nan" (the report schema's convention)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, torch.Tensor):
                out[f.name] = _plain(v)
        return out

    def to_text(self, name: str) -> str:
        """A heading naming the operand, then one line per statistic (``mxcheck stats``)."""
        q, r = self.snr_db_quantiles, self.rel_error_quantiles
        live = self.n_blocks - self.zero_blocks - self.nan_blocks
        exps = "  ".join(f"{e}:{n}" for e, n in self.scale_exponents.items()) or "-"
        return f"{name}: {self.shape[0]}x{self.shape[1]} ({self.domain} domain)\n" + table([
            ("blocks", f"{self.n_blocks} of {self.block[0]}x{self.block[1]} ({self.zero_blocks} all-zero, "
                       f"{self.nan_blocks} NaN)"),
            ("saturated", f"{_pct(self.saturated_fraction)} of {live} blocks ({self.saturated_blocks})"),
            ("overflow", f"{_pct(self.overflow_fraction)} ({self.overflow_blocks}): the clip changed a code"),
            ("flushed", f"{_pct(self.flushed_fraction)} of {self.nonzero_elements} non-zero elements "
                        f"({self.flushed_elements})"),
            ("SNR dB", f"{self.snr_db:.2f} overall; per block " +
                       " ".join(f"{k} {v:.2f}" for k, v in q.items())),
            ("rel error", " ".join(f"{k} {v:.4g}" for k, v in r.items())),
            ("scale exp", f"{exps}  (exponent:blocks)"),
        ])


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.2f}%"


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


@dataclass(frozen=True)
class _View:
    """What the quantizer consumed and gave back, and its block geometry."""

    ref: torch.Tensor  # float32 (R, C): padded and/or rotated input
    dq: torch.Tensor  # float32 (R, C)
    rows: int
    cols: int
    encode: torch.Tensor  # float32 per block: the multiplier applied before rounding
    exponent: torch.Tensor  # int64 per block: the scale's binade
    has_exponent: torch.Tensor  # bool per block


def _binade(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # frexp's mantissa is in [0.5, 1): floor(log2 v) is its exponent minus one, exactly.
    _, e = torch.frexp(v)
    return e.to(torch.int64) - 1, (v > 0) & torch.isfinite(v)


def _rotated(x: torch.Tensor, width: int, hadamard: Any) -> torch.Tensor:
    ref = torch.nn.functional.pad(x.float(), (0, width - x.shape[-1]))
    return ref if hadamard is None else apply_hadamard(ref, hadamard).float()


def _mx_view(x: torch.Tensor, q: MXTensor) -> _View:
    rows = q.block_size if q.block_2d else 1
    scales = q.scales[::rows]  # 2D tiles repeat their byte on each row
    exponent = scales.to(torch.int64) - 127
    return _View(_rotated(x, q.codes.shape[-1], q.hadamard), q.dequantize(padded=True), rows,
                 q.block_size, e8m0_reciprocal(scales), exponent, scales != 255)


def _nvfp4_view(x: torch.Tensor, q: NVFP4Tensor) -> _View:
    rows = NVFP4_BLOCK if q.block_2d else 1
    s_blk = decode(q.block_scales[::rows], FORMATS["ue4m3"])
    # The encode multiplier exactly as nvfp4_quantize forms it (same float32 operations).
    s_dec = 1.0 / _global_encode_scale(q.amax)
    encode = torch.minimum(1.0 / (s_blk * s_dec), torch.tensor(_FLT_MAX))
    return _View(_rotated(x, x.shape[-1], q.hadamard), q.dequantize(), rows, NVFP4_BLOCK, encode,
                 *_binade(s_blk))


def _fp8_view(x: torch.Tensor, q: FP8Tensor) -> _View:
    g = FP8_GRANULARITIES[q.granularity]
    r, c = x.shape
    rows, cols = g.rows or r, g.cols or c
    grid = (r // rows, c // cols)
    return _View(x.float(), q.dequantize(), rows, cols, q.scale.reshape(grid),
                 *_binade(q.scale_inv.reshape(grid)))


_VIEWS: dict[type, Callable[[torch.Tensor, Any], _View]] = {
    MXTensor: _mx_view, NVFP4Tensor: _nvfp4_view, FP8Tensor: _fp8_view}


def _block_sums(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = t.shape
    return t.reshape(r // rows, rows, c // cols, cols).sum(dim=(1, 3))


def _quantiles(v: torch.Tensor) -> dict[str, float]:
    if v.numel() == 0:
        return dict.fromkeys(QUANTILES, math.nan)
    # "lower" picks an actual block's value: no interpolation between inf and a number.
    q = torch.tensor(list(QUANTILES.values()), dtype=v.dtype, device=v.device)
    qs = torch.quantile(v, q, interpolation="lower")
    return {k: float(x) for k, x in zip(QUANTILES, qs.tolist(), strict=True)}


def _ratio(num: int, den: int) -> float:
    return num / den if den else math.nan


def _summarise(view: _View, spec: OperandSpec, shape: tuple[int, int], domain: str) -> BlockStats:
    amax = block_amax(view.ref, view.rows, view.cols)
    nan = torch.isnan(amax)
    live = ~nan & (amax != 0)
    fmt = get_format(spec.fmt)
    scaled = amax * view.encode
    saturated = live & (scaled > fmt.max)
    # 2**(emax - mbits) is the spacing of the top binade: the ulp of max.
    overflow = live & (scaled >= fmt.max + 2.0 ** (fmt.emax - fmt.mbits) / 2)
    err2 = _block_sums((view.dq.double() - view.ref.double()) ** 2, view.rows, view.cols)
    sig2 = _block_sums(view.ref.double() ** 2, view.rows, view.cols)
    nan64 = torch.tensor(math.nan, dtype=torch.float64)
    rel = torch.where(live, (err2 / sig2).sqrt(), nan64)
    snr = torch.where(live, 10 * torch.log10(sig2 / err2), nan64)
    ok = live & ~torch.isnan(snr)
    nonzero = (view.ref != 0) & ~torch.isnan(view.ref)
    flushed = nonzero & (view.dq == 0)
    finite_snr = snr[ok & torch.isfinite(snr)]
    return BlockStats(
        fmt=spec.fmt, scaling=spec.scaling, shape=shape, block=(view.rows, view.cols), domain=domain,
        n_blocks=amax.numel(), zero_blocks=int((amax == 0).sum()), nan_blocks=int(nan.sum()),
        saturated_blocks=int(saturated.sum()),
        saturated_fraction=_ratio(int(saturated.sum()), int(live.sum())),
        overflow_blocks=int(overflow.sum()), overflow_fraction=_ratio(int(overflow.sum()), int(live.sum())),
        nonzero_elements=int(nonzero.sum()), flushed_elements=int(flushed.sum()),
        flushed_fraction=_ratio(int(flushed.sum()), int(nonzero.sum())),
        scale_exponents=dict(sorted(Counter(view.exponent[live & view.has_exponent].tolist()).items())),
        snr_db=snr_db(view.dq, view.ref),
        exact_blocks=int((ok & (err2 == 0)).sum()),
        snr_histogram=dict(sorted(Counter(finite_snr.floor().to(torch.int64).tolist()).items())),
        rel_error_quantiles=_quantiles(rel[ok]), snr_db_quantiles=_quantiles(snr[ok]),
        block_rel_error=rel, block_snr_db=snr,
    )


def block_stats(
    x: torch.Tensor,
    spec: OperandSpec,
    *,
    generator: torch.Generator | None = None,
    state: DelayedScaling | None = None,
) -> BlockStats:
    """Quantize the 2D operand x as ``spec`` says and return its per-block statistics.

    ``generator``: where stochastic-rounding bits come from when ``spec.rounding == "sr"``
    (default: a fresh generator seeded 0, so the global RNG is never drawn from).
    ``state``: the ``DelayedScaling`` for ``spec.scaling == "delayed"``; it is advanced,
    as a quantize advances it (pass a copy to leave a model's state alone).
    """
    if not isinstance(spec, OperandSpec):
        raise TypeError(f"spec must be an OperandSpec, got {type(spec).__name__}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 2D operand [rows, contraction], got {shape}")
    if not spec.quantized:
        raise ValueError(f"spec has scaling={spec.scaling!r}: a {spec.fmt} operand has no blocks or scales")
    x = x.detach().contiguous()
    rand = None
    if spec.rounding == "sr":
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        rand = torch.randint(0, 256, tuple(x.shape), dtype=torch.uint8, generator=g,
                             device=g.device).to(x.device)
    with torch.no_grad():
        q: QTensor = quantize_operand(x, spec, rand=rand, state=state)
        assert not isinstance(q, PlainTensor)  # spec.quantized was checked
        view = _VIEWS[type(q)](x, q)
        domain = "rotated" if getattr(q, "hadamard", None) is not None else "input"
        return _summarise(view, spec, (x.shape[0], x.shape[1]), domain)


# ---- synthetic operands -------------------------------------------------------------


def _student_t3(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    # t with 3 degrees of freedom: heavy tails (finite variance), like activation outliers.
    chi2 = (torch.randn((3, *shape), generator=g) ** 2).sum(0)
    return torch.randn(shape, generator=g) / (chi2 / 3).sqrt()


def _laplace(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=g) - 0.5
    return -u.sign() * torch.log1p(-2 * u.abs())


def _outlier_channels(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    # Gaussian with every 128th column 32x larger: the channel outliers of DiT activations.
    x = torch.randn(shape, generator=g)
    x[..., ::128] *= 32
    return x


DISTRIBUTIONS: dict[str, Callable[[tuple[int, ...], torch.Generator], torch.Tensor]] = {
    "normal": lambda shape, g: torch.randn(shape, generator=g),
    "student-t3": _student_t3,
    "laplace": _laplace,
    "uniform": lambda shape, g: torch.rand(shape, generator=g) * 2 - 1,
    "outlier-channels": _outlier_channels,
}


def synthetic(shape: tuple[int, int], dist: str = "normal", *, seed: int = 0) -> torch.Tensor:
    """A float32 tensor drawn from ``DISTRIBUTIONS[dist]`` with a generator seeded ``seed``."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist={dist!r} is not known; expected one of {list(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[dist](tuple(shape), torch.Generator().manual_seed(seed)).float()
