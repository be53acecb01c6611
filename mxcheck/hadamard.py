"""Hadamard matrices and block-diagonal rotations, as the MX / NVFP4 recipes apply them.

A rotation multiplies each run of ``size`` consecutive elements along one axis by
``diag(signs) @ H * norm``, with ``H`` the unnormalised Sylvester Hadamard matrix. Applied
identically to both GEMM operands along the contraction axis it cancels,
``(A R)(B R)^T = A (R R^T) B^T``, exactly when ``R R^T = I``; with a rounded norm it
leaves a scale of ``size * norm**2`` (AITER MXFP6: 32 * 0.1767578125**2 = 0.99978...).

The transform is computed as a radix-2 butterfly (the fast Walsh-Hadamard transform),
then scaled by ``norm``: the order the Primus-Turbo ``rht16_inplace`` and AITER HIP
packers use (local butterflies, lane butterflies, one multiply by the norm). Where a sum
is not exact in float32 a kernel that adds in another order may differ in the last bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

from mxcheck.formats import check_float_tensor

__all__ = [
    "HADAMARDS",
    "Hadamard",
    "apply_hadamard",
    "check_length",
    "get_hadamard",
    "hadamard_matrix",
]

# Dtypes a rotation's input or output may be rounded to. torch (and ml_dtypes) convert
# float64 to bfloat16 through float32 with RNE twice, which is not RNE (1 + 2**-8 + 2**-30
# becomes 1, not 1 + 2**-7); _round_to goes through float32 rounded to odd instead.
_ROUNDING_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _is_power_of_two(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n & (n - 1) == 0


def hadamard_matrix(
    n: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (entries +-1, not normalised); n a power of two.

    Built by the recursion ``H_2n = [[H, H], [H, -H]]``, so ``H[i, j] = (-1)**popcount(i & j)``
    and H is symmetric.
    """
    if not _is_power_of_two(n):
        raise ValueError(f"n={n!r} is not a power of two >= 1; Sylvester Hadamard sizes are 1, 2, 4, ...")
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


@dataclass(frozen=True)
class Hadamard:
    """A block rotation ``x_block @ (diag(signs) @ H_size * norm)``.

    ``norm="exact"`` is ``1/sqrt(size)`` (orthonormal); a number is used as given, e.g.
    AITER MXFP6's bf16-rounded 1/sqrt(32) = 0.1767578125. ``signs`` (+-1 per row of H, as
    TransformerEngine's NVFP4 RHT) default to all +1. ``round_input_to`` rounds x (RNE)
    before rotating; ``round_output_to`` rounds the result (RNE) after.
    """

    size: int
    norm: float | Literal["exact"] = "exact"
    signs: tuple[int, ...] | None = None
    round_input_to: torch.dtype | None = None
    round_output_to: torch.dtype | None = None

    def __post_init__(self) -> None:
        if not _is_power_of_two(self.size):
            raise ValueError(f"size={self.size!r} is not a power of two >= 1")
        self._check_norm()
        if self.signs is not None:
            # A list would make the frozen dataclass unhashable; store a tuple.
            object.__setattr__(self, "signs", tuple(self.signs))
            self._check_signs()
        for name in ("round_input_to", "round_output_to"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in _ROUNDING_DTYPES:
                raise ValueError(
                    f"{name}={dtype!r} is not supported; expected None or one of "
                    f"{[str(d) for d in _ROUNDING_DTYPES]}"
                )

    def _check_norm(self) -> None:
        if self.norm == "exact":
            return
        ok = isinstance(self.norm, (int, float)) and not isinstance(self.norm, bool)
        if not ok or not (math.isfinite(self.norm) and self.norm > 0):
            raise ValueError(f"norm={self.norm!r}; expected 'exact' or a positive finite number")

    def _check_signs(self) -> None:
        if len(self.signs) != self.size:
            raise ValueError(f"signs has length {len(self.signs)}; expected size={self.size}")
        bad = [s for s in self.signs if isinstance(s, bool) or s not in (1, -1)]
        if bad:
            raise ValueError(f"signs must all be +1 or -1; got {bad[:4]!r}")

    @property
    def scale(self) -> float:
        """The numeric norm: 1/sqrt(size) for "exact", else norm."""
        return 1.0 / math.sqrt(self.size) if self.norm == "exact" else float(self.norm)

    def matrix(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """``diag(signs) @ H * scale`` (entries +-scale, each rounded once to dtype)."""
        m = hadamard_matrix(self.size, dtype=torch.float64, device=device) * self.scale
        if self.signs is not None:
            m = m * torch.tensor(self.signs, dtype=torch.float64, device=device)[:, None]
        return m.to(dtype)


# Named presets (facts and paths: /work/shared/research/primus_stack.md 1.6, 2.2;
# reference_emulators.md 6).
HADAMARDS: dict[str, Hadamard] = {
    # Primus-Turbo MXFP4 wgrad: csrc/kernels/quantization/quantization_mxfp4.cu rht16_inplace,
    # a fixed H16 applied twice per 32-block, "* 0.25f", no signs on main.
    "h16x2": Hadamard(16, norm=0.25),
    # AITER MXFP6 (branch mxfp6-gemms-clean) csrc/kernels/quant_mxfp6_gemm.cu:
    # kHadamard32Norm = 0.1767578125f (bf16 of 1/sqrt(32)); inputs rounded to bf16 first.
    "h32": Hadamard(32, norm=0.1767578125, round_input_to=torch.bfloat16),
    # TransformerEngine NVFP4 RHT: get_wgrad_sign_vector (mask 0xD7E8), H16 * 0.25 stored
    # in bf16; the reference matmul runs in bf16, so its result is bf16.
    "h16_te": Hadamard(
        16,
        norm=0.25,
        signs=(1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1),
        round_output_to=torch.bfloat16,
    ),
}


def get_hadamard(spec: str | Hadamard | None) -> Hadamard | None:
    """A preset by name; a Hadamard or None passes through."""
    if spec is None or isinstance(spec, Hadamard):
        return spec
    if not isinstance(spec, str) or spec not in HADAMARDS:
        raise ValueError(f"hadamard={spec!r} is not known; expected one of {sorted(HADAMARDS)}, a Hadamard or None")
    return HADAMARDS[spec]


def _to_float32_round_to_odd(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd: truncate toward zero, set the last bit if inexact.

    A second RNE rounding of this to a format with at least 2 fewer significand bits is
    the correctly rounded result (Boldo & Melquiond, "When double rounding is odd", 2005).
    """
    f = x.to(torch.float32)
    back = f.to(torch.float64)
    toward_zero = torch.where(back.abs() > x.abs(), torch.nextafter(f, torch.zeros_like(f)), f)
    inexact = (back != x) & ~x.isnan()
    return torch.where(inexact, (toward_zero.view(torch.int32) | 1).view(torch.float32), toward_zero)


def _round_to(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """x rounded (RNE, overflow to Inf) to dtype, returned in x's dtype (float32 or float64)."""
    if dtype is None or dtype == x.dtype:
        return x
    if x.dtype == torch.float32 or dtype == torch.float32:
        return x.to(dtype).to(x.dtype)  # one rounding: exact RNE
    return _to_float32_round_to_odd(x).to(dtype).to(x.dtype)


def _walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """x @ H along the last axis (length a power of two), by radix-2 butterflies."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < n:
        # Pairs (i, i + h) inside each run of 2h become (a + b, a - b), written straight into
        # their places (no third full-size pass, a stack, per stage) unless autograd records
        # the ops (out= is not differentiable).
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        if x.requires_grad and torch.is_grad_enabled():
            out = torch.stack((a + b, a - b), dim=-2)
        else:
            out = torch.empty_like(y)
            torch.add(a, b, out=out[..., 0, :])
            torch.sub(a, b, out=out[..., 1, :])
        x = out.reshape(*lead, n)
        h *= 2
    return x


@functools.lru_cache(maxsize=64)
def _signs_on(signs: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The signs as a tensor on device, made once: each copy to a GPU waits for it to drain."""
    return torch.tensor(signs, dtype=dtype, device=device)


def check_length(length: int, hadamard: Hadamard, axis: int) -> None:
    """ValueError unless runs of ``hadamard.size`` tile an axis of this length."""
    if length % hadamard.size:
        raise ValueError(
            f"axis {axis} has length {length}, not a multiple of the Hadamard size {hadamard.size}; "
            f"pad it to a multiple of {hadamard.size} first"
        )


def apply_hadamard(x: torch.Tensor, hadamard: Hadamard | str, *, axis: int = -1) -> torch.Tensor:
    """Rotate each run of ``hadamard.size`` consecutive elements of x along ``axis``.

    Computes in float32 (float64 stays float64) and returns that dtype: x is rounded to
    ``round_input_to`` first, multiplied by the signs, butterflied, scaled by the norm,
    then rounded to ``round_output_to``.
    """
    h = get_hadamard(hadamard)
    if h is None:
        raise ValueError("hadamard=None: there is no rotation to apply; skip the call instead")
    check_float_tensor(x)
    ndim = x.dim()
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for a {ndim}-d tensor of shape {tuple(x.shape)}")
    length = x.shape[axis]
    check_length(length, h, axis)
    work = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    work = _round_to(work, h.round_input_to)
    work = work.movedim(axis, -1)
    moved_shape = work.shape
    work = work.reshape(*moved_shape[:-1], length // h.size, h.size)
    if h.signs is not None:
        work = work * _signs_on(h.signs, work.dtype, work.device)
    # The norm as a tensor of the working dtype, so the multiply is one rounding in that dtype;
    # a host scalar (0-dim), which a device multiply takes by value: a copy would wait for the GPU.
    work = _walsh_hadamard(work) * torch.tensor(h.scale, dtype=work.dtype)
    work = work.reshape(moved_shape).movedim(-1, axis)
    return _round_to(work, h.round_output_to).contiguous()
