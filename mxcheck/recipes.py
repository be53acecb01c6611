"""Recipes as data: how each of the six operand copies of a linear's three GEMMs is quantized.

A linear Y = X W^T + b runs three NT GEMMs (``a[M, K] @ b[N, K]^T``):

====== ============== ============== ===========
GEMM   a              b              contraction
====== ============== ============== ===========
fwd    x_row X[M,K]   w_row W[N,K]   K
dgrad  g_row dY[M,N]  w_col W^T[K,N] N
wgrad  g_col dY^T[N,M] x_col X^T[K,M] M
====== ============== ============== ===========

Every spec quantizes along its operand's contraction axis (the last axis of the NT operand).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from mxcheck.formats import get_format
from mxcheck.hadamard import get_hadamard
from mxcheck.profiles import ALL_PROFILES, get_profile, pin_problem, pinned_fields
from mxcheck.scaling.fp8 import FP8_FORMATS, FP8_GRANULARITIES, SCALE_FORMULAS
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS
from mxcheck.scaling.rules import SCALE_RULES
from mxcheck.text import did_you_mean

__all__ = ["DERIVED_RECIPES", "GEMMS", "GEMM_DIRECTIONS", "LINEAR_DIRECTIONS", "OCP_MX_RECIPES", "OPERANDS",
           "PLAIN_RECIPES", "RECIPES", "SCALINGS", "OperandSpec", "Recipe", "get_recipe"]

OPERANDS = ("x_row", "w_row", "g_row", "w_col", "g_col", "x_col")
# gemm -> (a operand, b operand, name of the contraction dim)
GEMMS = {"fwd": ("x_row", "w_row", "K"), "dgrad": ("g_row", "w_col", "N"), "wgrad": ("g_col", "x_col", "M")}
GEMM_DIRECTIONS = tuple(GEMMS)  # fwd, dgrad, wgrad
LINEAR_DIRECTIONS = (*GEMM_DIRECTIONS, "bgrad")  # and the bias gradient, a column sum
SCALINGS = ("mx", "nvfp4", "delayed", "none", *FP8_GRANULARITIES)


@dataclass(frozen=True)
class OperandSpec:
    """How one operand copy is quantized (along its contraction axis).

    ``scaling``: "mx" (E8M0 blocks), "nvfp4", an FP8 granularity ("tensor", "row",
    "block1x128", "block128x128"), "delayed" (TE delayed scaling, tensorwise) or "none"
    (kept in ``Recipe.out_dtype``, e.g. bf16).
    """

    fmt: str = "bf16"
    scaling: str = "none"
    block_size: int = 32
    block_2d: bool = False
    scale_rule: str = "floor"
    rounding: str = "rne"
    hadamard: str | None = None
    zero_scale: int = 0
    pad_to: int | None = None
    scale_formula: str = "te"
    margin: int = 0
    power_of_2: bool = False
    profile: str | None = None  # quantized as this named profile does (mxcheck.profiles), bit for bit

    def __post_init__(self) -> None:
        get_format(self.fmt)
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling={self.scaling!r}; expected one of {list(SCALINGS)}")
        if self.scaling == "mx" and self.fmt not in MX_ELEMENT_FORMATS:
            raise ValueError(f"scaling='mx' needs an MX element format, got fmt={self.fmt!r}")
        if self.scaling in (*FP8_GRANULARITIES, "delayed") and self.fmt not in FP8_FORMATS:
            raise ValueError(f"scaling={self.scaling!r} needs an FP8 format, got fmt={self.fmt!r}")
        if self.scaling == "nvfp4" and (self.fmt, self.block_size) != ("e2m1", 16):
            raise ValueError(f"scaling='nvfp4' is e2m1 in blocks of 16, got fmt={self.fmt!r} "
                             f"block_size={self.block_size}")
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule={self.scale_rule!r}; expected one of {sorted(SCALE_RULES)}")
        if self.scale_formula not in SCALE_FORMULAS:
            raise ValueError(f"scale_formula={self.scale_formula!r}; expected one of {sorted(SCALE_FORMULAS)}")
        get_hadamard(self.hadamard)
        if self.profile is not None and (bad := pin_problem(self)):
            raise ValueError(f"OperandSpec: {bad}")

    @property
    def quantized(self) -> bool:
        return self.scaling != "none"

    def describe(self) -> str:
        """What this copy does, in a few words: format, scaling, block and scale rule (MX,
        NVFP4) or scale formula (FP8), rounding, rotation, and any field off its default."""
        if not self.quantized:
            return f"{self.fmt}, not quantized"
        parts = [self.fmt, self.scaling]
        if self.scaling in ("mx", "nvfp4"):
            parts.append(f"{self.block_size}x{self.block_size} blocks" if self.block_2d else f"1x{self.block_size} blocks")
            if self.scaling == "mx":
                parts.append(f"scale rule {self.scale_rule}")
        elif self.scaling != "delayed":
            parts.append(f"scale formula {self.scale_formula}")
        parts.append(self.rounding)
        parts += [f"{name}={getattr(self, name)!r}" for name in ("hadamard", "zero_scale", "pad_to", "margin",
                                                                 "power_of_2", "profile")
                  if getattr(self, name) != _DEFAULTS[name]]
        return ", ".join(parts)


_BF16 = OperandSpec()
_DEFAULTS = {f: getattr(_BF16, f) for f in OperandSpec.__dataclass_fields__}


@dataclass(frozen=True)
class Recipe:
    """Six operand specs plus what the linear does around its GEMMs."""

    name: str
    x_row: OperandSpec = _BF16
    w_row: OperandSpec = _BF16
    g_row: OperandSpec = _BF16
    w_col: OperandSpec = _BF16
    g_col: OperandSpec = _BF16
    x_col: OperandSpec = _BF16
    out_dtype: torch.dtype = torch.bfloat16
    shape_multiple: int = 1  # every GEMM dim (M, N, K) must be a multiple (MXFP6: 256)
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def spec(self, operand: str) -> OperandSpec:
        if operand not in OPERANDS:
            raise ValueError(f"operand={operand!r}; expected one of {list(OPERANDS)}")
        return getattr(self, operand)

    def with_gradient_sr(self) -> Recipe:
        """The same recipe with stochastic rounding on both gradient copies (g_row, g_col)."""
        return replace(self, name=f"{self.name}+sr", g_row=replace(self.g_row, rounding="sr"),
                       g_col=replace(self.g_col, rounding="sr"))

    def with_profile(self, profile: str) -> Recipe:
        """The recipe with every operand of the profile's scaling kind pinned to it (named
        ``recipe@profile``); the profile's scale rule, rounding, zero byte and rotation replace
        the spec's. ValueError where no operand has that kind or a spec cannot be pinned."""
        p = get_profile(profile)
        ops = [op for op in OPERANDS if self.spec(op).scaling == p.scaling]
        if not ops:
            raise ValueError(f"recipe {self.name} has no operand of scaling {p.scaling!r} for profile {p.name} "
                             f"to pin; its operands: {', '.join(f'{op}={self.spec(op).scaling}' for op in OPERANDS)}")
        pinned = {}
        for op in ops:
            try:
                pinned[op] = replace(self.spec(op), **pinned_fields(p))
            except ValueError as e:
                raise ValueError(f"recipe {self.name} operand {op}: {e}") from None
        return replace(self, name=f"{self.name}@{p.name}", **pinned)

    def check_shape(self, m: int, n: int, k: int, layer: str = "linear") -> None:
        """ValueError naming the layer and the dims a recipe cannot take."""
        bad = [f"{d}={v}" for d, v in zip("MNK", (m, n, k), strict=True) if v % self.shape_multiple]
        if bad:
            raise ValueError(f"recipe {self.name} needs M, N, K multiples of {self.shape_multiple}; "
                             f"layer {layer} has {', '.join(bad)} (M={m} N={n} K={k})")


def _all(spec: OperandSpec, **kw) -> dict[str, OperandSpec]:
    return dict.fromkeys(OPERANDS, spec) | kw


_MXFP4 = OperandSpec("e2m1", "mx", scale_rule="even", pad_to=128)
_MXFP4_W = replace(_MXFP4, block_2d=True)
_MXFP4_WGRAD = replace(_MXFP4, hadamard="h16x2")
_E5M2_T = OperandSpec("e5m2", "tensor", scale_formula="primus_turbo")
_E4M3_T = OperandSpec("e4m3", "tensor", scale_formula="primus_turbo")
_NVFP4 = OperandSpec("e2m1", "nvfp4", block_size=16)
_E4M3_ROW_POW2 = OperandSpec("e4m3", "row", scale_formula="te", power_of_2=True)
_E4M3_B1 = OperandSpec("e4m3", "block1x128", scale_formula="te", power_of_2=True)
_E4M3_B2 = OperandSpec("e4m3", "block128x128", scale_formula="te", power_of_2=True)

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("mxfp4", x_row=_MXFP4, w_row=_MXFP4_W, g_row=_MXFP4, w_col=_MXFP4_W, g_col=_MXFP4_WGRAD,
           x_col=_MXFP4_WGRAD,
           source="Primus primus_turbo_mxfp4_local.py + Primus-Turbo gemm_fp4.py::FP4GemmMXFunction",
           notes=("weights 2D 32x32 both ways; H16 (+) H16 / 4 on the wgrad pair, along M",
                  "scale rule even (compute_tile_scale); K padded to 128")),
    Recipe("mxfp4-fp8bwd", x_row=_MXFP4, w_row=_MXFP4_W, g_row=_E5M2_T, w_col=_E5M2_T, g_col=_E5M2_T,
           x_col=_E5M2_T, source="Primus mxfp4_backward_precision=fp8",
           notes=("backward re-quantizes the saved bf16 X, W and dY to e5m2 tensorwise",)),
    Recipe("mxfp6", **_all(OperandSpec("e2m3", "mx", scale_rule="floor", rounding="half_away",
                                       hadamard="h32", zero_scale=127)),
           shape_multiple=256, source="AITER gemm_op_a6w6.py (mxfp6-gemms-clean) + Primus-Turbo FP6GemmMXFunction",
           notes=("32-point Hadamard on every operand, norm bf16(1/sqrt(32)), inputs rounded to bf16",
                  "zero block -> scale byte 127; bias inside the Function")),
    Recipe("fp8", **_all(_E4M3_T), source="Primus-Turbo quantize_fp8_tensorwise: 448 / max(amax, 1e-12)"),
    Recipe("fp8-hybrid", **_all(_E4M3_T, g_row=_E5M2_T, g_col=_E5M2_T),
           source="e4m3 forward, e5m2 gradients (TE Format.HYBRID)"),
    Recipe("fp8-delayed", **_all(OperandSpec("e4m3", "delayed"), g_row=OperandSpec("e5m2", "delayed"),
                                 g_col=OperandSpec("e5m2", "delayed")),
           source="TE DelayedScaling(fp8_format=HYBRID, amax_history_len=1024, amax_compute_algo='max')"),
    Recipe("mxfp8", **_all(OperandSpec("e4m3", "mx", scale_rule="rceil")),
           source="TE MXFP8BlockScaling: e4m3 1x32 blocks both directions, E8M0 round-up"),
    Recipe("nvfp4", x_row=_NVFP4, w_row=replace(_NVFP4, block_2d=True), g_row=replace(_NVFP4, rounding="sr"),
           w_col=replace(_NVFP4, block_2d=True), g_col=replace(_NVFP4, rounding="sr", hadamard="h16_te"),
           x_col=replace(_NVFP4, hadamard="h16_te"),
           source="TE NVFP4BlockScaling: 2D 16x16 weights, RHT on the wgrad pair, SR on gradients"),
    Recipe("fp8-block", x_row=_E4M3_B1, w_row=_E4M3_B2, g_row=_E4M3_B1, w_col=_E4M3_B2, g_col=_E4M3_B1,
           x_col=_E4M3_B1, shape_multiple=128,
           source="TE Float8BlockScaling (common/recipe/__init__.py): x_block_scaling_dim=1, "
                  "w_block_scaling_dim=2, grad_block_scaling_dim=1, power-of-2 scales, e4m3",
           notes=("1x128 blocks along the contraction axis for x and dY, 128x128 for W; scales are "
                  "powers of two (TE's default use_f32_scales=False)",
                  "TE 2.20.2's quantizers give these codes and scales bit for bit on an H200 "
                  "(references/baselines/h200/probes/te_fp8_probe.log)")),
    # Derived recipes: what torchao's linears compute, where no recipe above matches them.
    Recipe("mxfp4-1x32", **_all(OperandSpec("e2m1", "mx", scale_rule="even")),
           source="torchao 0.18 prototype/moe_training/mxfp8_linear.py::mx_mm with float4_e2m1fn_x2 and "
                  "ScaleCalculationMode.EVEN",
           notes=("mxfp4 without its 2D weight blocks, wgrad Hadamard and K padding: every operand in "
                  "1x32 blocks along its contraction axis",)),
    Recipe("fp8-rowwise", **_all(_E4M3_ROW_POW2),
           source="torchao 0.18 float8/config.py Float8LinearRecipeName.ROWWISE: e4m3 everywhere, "
                  "axiswise along the contraction dim, round_scales_to_power_of_2=True",
           notes=("scale 448 / amax floored to a power of two; torchao floors with exp2(floor(log2(s))) in "
                  "float32, which rounds up for a scale a few ulps under 2^k (mxcheck masks the bits)",)),
)}


# OCP MX v1.0 (the standard every MX library claims): floor rule, RNE, saturating, 1x32 blocks
# along the contraction axis on all six operand copies, no rotation, all-zero block byte 0.
OCP_MX_RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe(name, **_all(OperandSpec(fmt, "mx")),
           source="OCP Microscaling Formats (MX) v1.0, section 6.3: X = 2^(floor(log2(amax)) - emax_elem)",
           notes=(f"{fmt} elements, E8M0 scales, 1x32 blocks along the contraction axis everywhere",))
    for name, fmt in (("ocp-mxfp4", "e2m1"), ("ocp-mxfp6-e2m3", "e2m3"), ("ocp-mxfp6-e3m2", "e3m2"),
                      ("ocp-mxfp8-e4m3", "e4m3"), ("ocp-mxfp8-e5m2", "e5m2")))}


# Plain recipes: a format as its specification states it, with none of one training stack's
# extras (2D weight tiles, rotations, stochastic rounding, delayed scaling). What inference
# and QAT libraries compute, and what a fake-quant kernel usually claims.
PLAIN_RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("nvfp4-1x16", **_all(_NVFP4),
           source="NVIDIA NVFP4 as specified for inference and QAT (TensorRT Model Optimizer "
                  "nvfp4_tensor.py, 'Pretraining LLMs with NVFP4' arXiv:2509.25149 section 2): e2m1 "
                  "elements, 1x16 blocks, ue4m3 block scales, an fp32 tensor scale amax / (6 * 448)",
           notes=("every copy (x_row, w_row, g_row, w_col, g_col, x_col): e2m1 in 1x16 blocks along its "
                  "contraction axis, RNE, no rotation, no stochastic rounding",
                  "the built-in `nvfp4` is TransformerEngine's training recipe instead: 2D 16x16 weight "
                  "blocks, RHT on the wgrad pair, SR on the gradients")),
    Recipe("fp8-tensorwise", **_all(OperandSpec("e4m3", "tensor", scale_formula="te")),
           source="FP8 current (per-tensor) scaling with TransformerEngine's compute_scale_from_amax: "
                  "scale = 448 / amax in float32, amax 0/Inf/NaN gives scale 1 (TE Float8CurrentScaling "
                  "with fp8_format=E4M3; torchao Float8LinearConfig tensorwise)",
           notes=("every copy: e4m3 tensorwise, one float32 scale per operand copy, RNE, saturating; no "
                  "delayed scaling (no amax history)",
                  "the built-in `fp8` is Primus-Turbo's formula instead: 448 / max(amax, 1e-12), so an "
                  "all-zero or NaN tensor gets another scale than here")),
)}


def _takes_gradient_sr(recipe: Recipe) -> bool:
    """Both gradient copies are MX or NVFP4 (the scalings with an SR path) and not SR already."""
    return all(recipe.spec(op).scaling in ("mx", "nvfp4") and recipe.spec(op).rounding != "sr"
               for op in ("g_row", "g_col"))


# Derived recipes: a named recipe with SR on its gradients (``Recipe.with_gradient_sr``).
DERIVED_RECIPES: dict[str, Recipe] = {r.name: r for r in (
    base.with_gradient_sr() for base in RECIPES.values() if _takes_gradient_sr(base))}


def get_recipe(recipe: str | Recipe) -> Recipe:
    """A recipe by name: one of RECIPES, PLAIN_RECIPES, DERIVED_RECIPES (``mxfp4+sr``, ...) or OCP_MX_RECIPES,
    or ``NAME@PROFILE`` (``mxfp8@torchao.floor``): that recipe pinned to a profile. An unknown
    name is a ValueError naming the nearest known one."""
    if isinstance(recipe, Recipe):
        return recipe
    tables = (RECIPES, PLAIN_RECIPES, DERIVED_RECIPES, OCP_MX_RECIPES)
    known = [name for table in tables for name in table]
    if isinstance(recipe, str) and "@" in recipe:  # NAME@PROFILE: Recipe.with_profile
        base, _, profile = recipe.partition("@")
        if base not in known:
            raise ValueError(f"recipe={recipe!r}: {base!r} is not a known recipe{did_you_mean(base, known)}; "
                             f"expected one of {sorted(known)}, then @ and a profile")
        if profile not in ALL_PROFILES:
            raise ValueError(f"recipe={recipe!r}: {profile!r} is not a known profile"
                             f"{did_you_mean(profile, list(ALL_PROFILES))}; known profiles: {', '.join(ALL_PROFILES)}")
        return get_recipe(base).with_profile(profile)
    for table in tables:
        if isinstance(recipe, str) and recipe in table:
            return table[recipe]
    raise ValueError(f"recipe={recipe!r} is not known{did_you_mean(str(recipe), known)}; expected one of "
                     f"{sorted(RECIPES)}, {sorted(PLAIN_RECIPES)}, {sorted(OCP_MX_RECIPES)} or {sorted(DERIVED_RECIPES)}")
