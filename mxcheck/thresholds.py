"""SNR floors with their reasons, and the measurements that justify them.

Every floor the suite asserts lives here, next to what the oracle measures on Gaussian
data (float64 truth), so a reader can see the margin. A floor sits well under the
measured value: it catches a wrong scale rule, a missing rotation or a nibble swap (tens
of dB), not noise. ``measure`` recomputes the numbers; ``mxcheck thresholds`` prints them
per format, scale rule and K; ``tests/test_thresholds.py`` holds every floor at least
``MIN_MARGIN_DB`` under the live measurement.

Accumulation: a float32 sum of K products has a worst-case error K * 2**-24 * sum|a b|
(what ``conformance.check_gemm`` asserts) and a typical one that grows with sqrt(K);
``accumulation_snr_ceiling_db(k)`` is that typical limit, far above every floor here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from mxcheck.metrics import snr_db
from mxcheck.recipes import LINEAR_DIRECTIONS
from mxcheck.text import table

__all__ = [
    "BGRAD_FLOOR_DB",
    "DESIGN_ANCHORS_DB",
    "FORMAT_LINEAR_FLOORS",
    "GEMM_FLOORS",
    "LINEAR_SNR_FLOORS",
    "MIN_MARGIN_DB",
    "MODEL_FLOORS",
    "QUANTIZE_FLOORS",
    "RECIPE_ANCHOR_FORMATS",
    "SAME_OPERANDS_FLOOR_DB",
    "Floor",
    "ThresholdRow",
    "accumulation_snr_ceiling_db",
    "fp32_accumulation_bound",
    "gemm_floor",
    "linear_floor",
    "measure",
    "model_floor",
    "quantize_floor",
    "threshold_table",
    "thresholds_json",
    "thresholds_text",
]

MIN_MARGIN_DB = 1.5


@dataclass(frozen=True)
class Floor:
    db: float
    reason: str
    bwd: float | None = None  # dgrad/wgrad floor of a linear where the backward has another format
    # Quantized GEMMs in series whose (independent, equal) noises add: the anchor of one GEMM
    # less 10 log10(gemms) dB is what the floor answers to (tests/test_thresholds.py).
    gemms: int = 1


# Quantize-dequantize SNR of randn data against float64, keyed "scaling/fmt" (or mode).
QUANTIZE_FLOORS: dict[str, Floor] = {
    "mx/e2m1": Floor(15.0, "measured 16.8 (ceil) to 19.0 (even) dB; DESIGN.md anchor: MXFP4 > 10"),
    "mx/e2m3": Floor(26.0, "measured 28.8 (ceil) to 31.0 dB"),
    "mx/e3m2": Floor(22.0, "measured 25.4 to 25.6 dB"),
    "mx/e4m3": Floor(27.0, "measured 30.7 (floor) to 31.5 (rceil) dB"),
    "mx/e5m2": Floor(22.0, "measured 25.4 to 25.6 dB"),
    "nvfp4/1x16": Floor(18.5, "measured 20.4 dB (E4M3 block scale, fp32 global)"),
    "nvfp4/16x16": Floor(17.0, "measured ~19 dB (2D 16x16 weight tiles)"),
    "nvfp4/1x16+h16_te": Floor(18.5, "measured ~20 dB with TE's fixed-sign H16"),
    "fp8/e4m3": Floor(25.0, "measured 31.5 dB tensorwise; DESIGN.md anchor e4m3 > 25"),
    "fp8/e5m2": Floor(20.0, "measured 25.6 dB tensorwise; DESIGN.md anchor e5m2 > 20"),
    "fp8/e4m3fnuz": Floor(25.0, "as e4m3 (one more binade, same mantissa)"),
    "fp8/e5m2fnuz": Floor(20.0, "as e5m2"),
}

# SNR of the MX GEMM of two quantized randn operands against the float64 product of the
# unquantized ones: both operands' noise adds, about 3 dB under the quantize SNR.
GEMM_FLOORS: dict[str, Floor] = {
    "mx/e2m1": Floor(12.0, "measured 13.8 (ceil) to 16.1 (even) dB, flat in K"),
    "mx/e2m3": Floor(24.0, "measured 25.8 (ceil) to 28.1 dB; DESIGN.md anchor MXFP6 > 24"),
    "mx/e3m2": Floor(19.0, "measured 22.3 to 22.6 dB"),
    "mx/e4m3": Floor(25.0, "measured 27.7 (floor) to 28.6 (rceil) dB; DESIGN.md anchor e4m3 > 25"),
    "mx/e5m2": Floor(20.0, "measured 22.3 to 22.6 dB; DESIGN.md anchor e5m2 > 20"),
}

# fwd / dgrad / wgrad SNR of a whole quantized linear against float64 truth (randn inputs,
# weights scaled 1/sqrt(K)); measured at M=N=256, K=512 and at every Flux 12B shape.
LINEAR_SNR_FLOORS: dict[str, Floor] = {
    "mxfp4": Floor(10.0, "measured 15.1-16.0 dB; DESIGN.md anchor MXFP4 GEMM > 10"),
    "mxfp4-fp8bwd": Floor(10.0, "forward as mxfp4 (15.5 dB); e5m2 backward 22.5 dB, anchor e5m2 > 20", bwd=20.0),
    "mxfp6": Floor(24.0, "measured 27.9-28.0 dB on randn, 27.8-28.2 on conformance inputs; DESIGN.md anchor MXFP6 > 24"),
    "fp8": Floor(25.0, "measured 28.5 dB; DESIGN.md anchor e4m3 > 25"),
    "fp8-hybrid": Floor(25.0, "e4m3 forward 28.5 dB (anchor > 25); e5m2 gradients 24.5 dB (anchor > 20)", bwd=20.0),
    "mxfp8": Floor(25.0, "measured 28.4-28.5 dB"),
    "nvfp4": Floor(10.0, "measured 15.1-16.7 dB (SR gradients cost ~1.5 dB)"),
    "fp8-delayed": Floor(25.0, "as fp8-hybrid after 3 steps of amax history: fwd 28.5 dB, dgrad/wgrad "
                               "24.5 (26.6 on conformance inputs); anchors e4m3 > 25, e5m2 > 20", bwd=20.0),
    "mxfp4-1x32": Floor(10.0, "measured 16.0-19.0 dB (1x32 even blocks, no rotation)"),
    "fp8-rowwise": Floor(25.0, "measured 28.5-31.5 dB (rowwise e4m3, power-of-2 scales)"),
    "fp8-block": Floor(25.0, "measured 28.5-31.5 dB on an H200 (TE Float8BlockScaling, 256x256x512); "
                              "anchor e4m3 > 25"),
    # Plain recipes (recipes.PLAIN_RECIPES): the format as its specification states it.
    "nvfp4-1x16": Floor(10.0, "measured 17.3-17.7 dB (sd <= 0.51, min 16.6) over 60 seeds on conformance inputs "
                              "(1x16 blocks everywhere, RNE); DESIGN.md anchor e2m1 > 10"),
    "fp8-tensorwise": Floor(25.0, "measured 55.4 dB fwd, 30.3 dB dgrad/wgrad (min 30.2) over 60 seeds on "
                                  "conformance inputs (e4m3 tensorwise, TE's formula); DESIGN.md anchor e4m3 > 25"),
    # OCP MX v1.0 (floor rule): on conformance inputs the floor rule saturates block maxima near
    # the top of a binade (amax / 2^e up to 2 x the format's top power of two), so these sit
    # under the vendor rules' figures and answer to no DESIGN anchor.
    "ocp-mxfp4": Floor(10.0, "measured 15.0 dB (sd 0.38, min 14.0) over 60 seeds on conformance inputs (floor rule)"),
    "ocp-mxfp6-e2m3": Floor(22.0, "measured 27.8-28.1 dB (sd 0.42-0.51) over 60 seeds on conformance inputs"),
    "ocp-mxfp6-e3m2": Floor(17.0, "measured 22.5-22.6 dB (sd 0.48-0.59) over 60 seeds on conformance inputs"),
    "ocp-mxfp8-e4m3": Floor(17.0, "measured 23.5 dB (sd 0.71-0.90, min 21.5) over 60 seeds on conformance inputs "
                                  "(mxfp8, rceil: 28.5)"),
    "ocp-mxfp8-e5m2": Floor(17.0, "measured 22.6-22.7 dB (sd 0.51-0.62) over 60 seeds on conformance inputs"),
}
# Whole layers and models against float64 truth or the unquantized model, keyed "what/recipe".
MODEL_FLOORS: dict[str, Floor] = {
    "mlp/mxfp6": Floor(21.0, "fc1 -> GELU -> fc2, two mxfp6 GEMMs in series (256x256x256): measured "
                             "24.7-25.1 dB over seeds 0..9, 3 dB under one GEMM as two noises add; "
                             "anchor MXFP6 > 24 less 10 log10(2)", gemms=2),
    "flux-tiny/mxfp8": Floor(50.0, "quantized flux-tiny (10 linears) against the same bf16 model: measured "
                                   "60.1-61.9 dB over model seeds 0..3; a wrong scale costs tens of dB"),
}
BGRAD_FLOOR_DB = 35.0  # a float32 column sum of the unquantized dY: measured 55 dB; anchor > 35
# Same quantized operands as the reference Function: only accumulation order and output
# rounding differ (measured 63 dB for torch._scaled_mm FP8 at every Flux 12B shape).
SAME_OPERANDS_FLOOR_DB = 40.0

# DESIGN.md "Tests and markers": the thresholds of public suites that no floor may sit
# under (tests/test_thresholds.py holds every floor here at or above its anchor).
DESIGN_ANCHORS_DB: dict[str, float] = {"e2m1": 10.0, "e2m3": 24.0, "e4m3": 25.0, "e5m2": 20.0, "bgrad": 35.0}
# recipe -> the anchor of its least precise quantized format (e3m2 has no DESIGN anchor).
RECIPE_ANCHOR_FORMATS = {"mxfp4": "e2m1", "mxfp4-fp8bwd": "e2m1", "mxfp6": "e2m3", "fp8": "e4m3",
                         "fp8-hybrid": "e5m2", "fp8-delayed": "e5m2", "mxfp8": "e4m3", "nvfp4": "e2m1",
                         "mxfp4-1x32": "e2m1", "fp8-rowwise": "e4m3", "fp8-block": "e4m3",
                         "nvfp4-1x16": "e2m1", "fp8-tensorwise": "e4m3"}
DERIVED_SUFFIX = "+sr"  # recipes.Recipe.with_gradient_sr: judged against the base recipe's floor


def quantize_floor(key: str) -> float:
    """The quantize SNR floor for ``"mx/e2m1"``, ``"nvfp4/1x16"``, ``"fp8/e4m3"``, ..."""
    try:
        return QUANTIZE_FLOORS[key].db
    except KeyError:
        raise ValueError(f"no quantize floor for {key!r}; known: {sorted(QUANTIZE_FLOORS)}") from None


def gemm_floor(key: str) -> float:
    """The GEMM SNR floor for ``"mx/e2m1"`` ... (two quantized operands vs float64 truth)."""
    try:
        return GEMM_FLOORS[key].db
    except KeyError:
        raise ValueError(f"no GEMM floor for {key!r}; known: {sorted(GEMM_FLOORS)}") from None


def model_floor(key: str) -> float:
    """The SNR floor of a layer or model, ``"mlp/mxfp6"``, ``"flux-tiny/mxfp8"``."""
    try:
        return MODEL_FLOORS[key].db
    except KeyError:
        raise ValueError(f"no model floor for {key!r}; known: {sorted(MODEL_FLOORS)}") from None


# A recipe the tables above do not name (a user's recipe file, a backend's own claim) is
# held to the floor of its least precise quantized copy: per scaling and element format, the
# lowest linear floor of a named recipe of that kind (MX: the OCP floor rule's, which clips
# block maxima; FP8 scalings: the tensorwise recipes').
FORMAT_LINEAR_FLOORS: dict[tuple[str, str], float] = {
    ("mx", "e2m1"): 10.0, ("mx", "e2m3"): 22.0, ("mx", "e3m2"): 17.0, ("mx", "e4m3"): 17.0, ("mx", "e5m2"): 17.0,
    ("nvfp4", "e2m1"): 10.0, ("fp8", "e4m3"): 25.0, ("fp8", "e5m2"): 20.0, ("fp8", "e4m3fnuz"): 25.0,
    ("fp8", "e5m2fnuz"): 20.0,
}
_FWD_COPIES, _BWD_COPIES = ("x_row", "w_row"), ("g_row", "w_col", "g_col", "x_col")


def _derived_floor(recipe: Any, direction: str) -> float:
    """The floor of ``recipe``'s least precise quantized copy in ``direction``'s GEMMs."""
    copies = _FWD_COPIES if direction == "fwd" else _BWD_COPIES
    floors = []
    for op in copies:
        spec = recipe.spec(op)
        if not spec.quantized:
            continue
        kind = spec.scaling if spec.scaling in ("mx", "nvfp4") else "fp8"
        if (kind, spec.fmt) not in FORMAT_LINEAR_FLOORS:
            raise ValueError(f"no linear SNR floor for {op} of recipe {recipe.name!r} ({kind} {spec.fmt}); known "
                             f"kinds: {sorted(FORMAT_LINEAR_FLOORS)}; add one to mxcheck.thresholds")
        floors.append(FORMAT_LINEAR_FLOORS[kind, spec.fmt])
    if not floors:
        raise ValueError(f"no linear SNR floor for recipe {recipe.name!r}: it quantizes none of {list(copies)}")
    return min(floors)


def linear_floor(recipe: Any, direction: str = "fwd") -> float:
    """The ``direction`` (fwd, dgrad, wgrad; bgrad: BGRAD_FLOOR_DB) SNR floor of a recipe's
    linear against float64 truth. ``recipe`` is a name or a ``Recipe``. A derived recipe
    ``base+sr`` (gradient SR, measured within 1.5 dB of the base) and a pinned one
    ``base@profile`` have the base's floors. A ``Recipe`` the tables do not name gets the
    floor of its least precise quantized copy (FORMAT_LINEAR_FLOORS); a name they do not
    know is a ValueError."""
    if direction not in LINEAR_DIRECTIONS:
        raise ValueError(f"direction={direction!r}; expected one of {list(LINEAR_DIRECTIONS)}")
    name = recipe if isinstance(recipe, str) else getattr(recipe, "name", recipe)
    base = name.partition("@")[0].removesuffix(DERIVED_SUFFIX) if isinstance(name, str) else name
    f = LINEAR_SNR_FLOORS.get(base) if isinstance(base, str) else None
    if f is None and not isinstance(recipe, str) and hasattr(recipe, "spec"):
        return BGRAD_FLOOR_DB if direction == "bgrad" else _derived_floor(recipe, direction)
    if f is None:
        raise ValueError(f"no linear SNR floor for recipe {name!r}; known: {sorted(LINEAR_SNR_FLOORS)} "
                         f"and their {DERIVED_SUFFIX!r} variants; add one to mxcheck.thresholds") from None
    if direction == "bgrad":
        return BGRAD_FLOOR_DB
    return f.bwd if direction != "fwd" and f.bwd is not None else f.db


def accumulation_snr_ceiling_db(k: int, unit_roundoff: float = 2.0**-24) -> float:
    """SNR a float32 accumulation of K random-sign products typically allows:
    -20 log10(sqrt(K) u). 6 dB lower each time K quadruples."""
    if k < 1:
        raise ValueError(f"k={k!r}: expected a positive contraction length")
    return -20.0 * math.log10(math.sqrt(k) * unit_roundoff)


def fp32_accumulation_bound(da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
    """Worst-case |error| of a float32 sum of K products, any order: K * 2**-24 * (|A| |B|^T)."""
    k = da.shape[-1]
    return k * 2.0**-24 * (da.double().abs() @ db.double().abs().T)


@dataclass(frozen=True)
class ThresholdRow:
    fmt: str
    scale_rule: str
    k: int
    quantize_snr_db: float
    quantize_floor_db: float
    gemm_snr_db: float
    gemm_floor_db: float
    accumulation_ceiling_db: float

    @property
    def margin_db(self) -> float:
        """The smaller headroom of the two measurements over their floors."""
        return min(self.quantize_snr_db - self.quantize_floor_db, self.gemm_snr_db - self.gemm_floor_db)


def measure(fmt: str, scale_rule: str, k: int, *, rows: int = 128, seed: int = 0) -> ThresholdRow:
    """Quantize SNR of a (rows, k) randn tensor and SNR of the MX GEMM of two such tensors
    (float32 accumulation) against the float64 product of the unquantized inputs."""
    from mxcheck.gemm import emulated_gemm  # noqa: PLC0415  (gemm imports the scaling stack)
    from mxcheck.scaling.mx import mx_quantize  # noqa: PLC0415

    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rows, k, generator=gen), torch.randn(rows, k, generator=gen)
    qa, qb = (mx_quantize(t, fmt, scale_rule=scale_rule) for t in (a, b))
    truth = a.double() @ b.double().T
    return ThresholdRow(fmt, scale_rule, k, snr_db(qa.dequantize(), a.double()), quantize_floor(f"mx/{fmt}"),
                        snr_db(emulated_gemm(qa, qb, out_dtype=torch.float32), truth), gemm_floor(f"mx/{fmt}"),
                        accumulation_snr_ceiling_db(k))


def threshold_table(formats: tuple[str, ...] = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2"),
                    rules: tuple[str, ...] = ("floor", "ceil", "even", "rceil"),
                    ks: tuple[int, ...] = (256, 3072, 12288), *, rows: int = 128,
                    seed: int = 0) -> list[ThresholdRow]:
    """``measure`` for every format, scale rule and K."""
    return [measure(f, r, k, rows=rows, seed=seed) for f in formats for r in rules for k in ks]


def _floor_tables() -> dict[str, dict[str, Floor]]:
    return {"quantize": QUANTIZE_FLOORS, "gemm": GEMM_FLOORS, "linear": LINEAR_SNR_FLOORS}


def thresholds_json(rows: list[ThresholdRow]) -> dict[str, Any]:
    """The measured rows (with their margin) and every floor with its reason."""
    return {"measured": [dict(r.__dict__, margin_db=r.margin_db) for r in rows],
            "floors": {kind: {k: {"db": f.db, "reason": f.reason} for k, f in table.items()}
                       for kind, table in _floor_tables().items()},
            "bgrad_floor_db": BGRAD_FLOOR_DB}


def thresholds_text(rows: list[ThresholdRow], *, n_rows: int, seed: int) -> str:
    """The measured rows against their floors, then every floor table (``mxcheck thresholds``);
    ``n_rows`` and ``seed`` are what the rows were measured with."""
    measured = [["fmt", "rule", "K", "quantize dB", "floor", "GEMM dB", "floor", "fp32 acc. ceiling dB",
                 "margin"]]
    measured += [[r.fmt, r.scale_rule, str(r.k), f"{r.quantize_snr_db:.2f}", f"{r.quantize_floor_db:.1f}",
                  f"{r.gemm_snr_db:.2f}", f"{r.gemm_floor_db:.1f}", f"{r.accumulation_ceiling_db:.1f}",
                  f"{r.margin_db:+.2f}"] for r in rows]
    lines = [f"Measured SNR against float64 on randn ({n_rows} x K, seed {seed}) and the floors the "
             "suite asserts:", table(measured)]
    for kind, entries in _floor_tables().items():
        lines.append(f"{kind} floors:")
        lines.append(table([[key, f"{f.db:.1f} dB", f.reason] for key, f in entries.items()]))
    lines.append(f"bias gradient floor: {BGRAD_FLOOR_DB:.1f} dB\n")
    return "\n".join(lines)
