"""TransformerEngine delayed scaling: the amax-history state machine, fused and unfused.

Expected histories and scales are literals derived by hand from TE's documented algorithm:
transformer_engine/common/recipe/delayed_scaling.cu (kernel_bulk, the default fused path) and
transformer_engine/pytorch/quantization.py (_default_get_amax_and_update_history,
_update_amax_history, _default_sf_compute, the unfused path). Each update:
  1. history[0] = the step's amax;
  2. amax = max over all L entries ('max') or history[0] ('most_recent');
  3. roll: new[i] = old[i+1], new[L-1] = old[0], then new[0] = 0;
  4. scale = 448 * 2^-margin / amax if amax is finite and > 0, else the old scale; Inf -> FLT_MAX.
Fused: when history[0] == 0 there is no roll and the max is 0 (scale kept); fmaxf skips NaN.
Unfused: always rolls; torch.max returns NaN if any entry is NaN (scale kept).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mxcheck.plugin import needs
from mxcheck.scaling.fp8 import DelayedScaling

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

NAN, INF = math.nan, math.inf
FLT_MAX = float(np.finfo(np.float32).max)


def same(actual: torch.Tensor, expected: list[float] | float) -> bool:
    """Bit equality in float32 (NaN == NaN)."""
    e = torch.tensor(expected, dtype=torch.float32)
    return torch.equal(actual.view(torch.int32), e.view(torch.int32)) if not e.isnan().any() else (
        torch.equal(actual.isnan(), e.isnan()) and torch.equal(actual.nan_to_num(), e.nan_to_num())
    )


# (amax recorded at this step, history after the update, scale after the update)
# L = 3, 'max', e4m3 (448), margin 0.
FUSED_MAX = [
    (2.0, [0, 0, 2], 224.0),      # 448 / 2
    (0.0, [0, 0, 2], 224.0),      # amax 0: kernel_bulk skips the roll, scale kept
    (8.0, [0, 2, 8], 56.0),       # window {8, 0, 2}; old[1] = 0 is dropped by the roll
    (INF, [0, 8, INF], 56.0),     # Inf amax: scale kept
    (NAN, [0, INF, NAN], 56.0),   # NaN != 0 so it rolls; fmaxf(8, Inf, NaN) = Inf: kept
    (1.0, [0, NAN, 1], 56.0),     # window {1, Inf, NaN}: Inf, kept
    (1.0, [0, 1, 1], 448.0),      # window {1, NaN, 1}: fmaxf skips NaN -> 1
    (0.0, [0, 1, 1], 448.0),      # no roll
    (0.5, [0, 1, 0.5], 448.0),    # window {0.5, 1, 1}
]
UNFUSED_MAX = [
    (2.0, [0, 0, 2], 224.0),
    (0.0, [0, 2, 0], 224.0),      # rolls even for amax 0; window {0, 0, 2} -> 2
    (8.0, [0, 0, 8], 56.0),       # window {8, 2, 0}
    (INF, [0, 8, INF], 56.0),
    (NAN, [0, INF, NAN], 56.0),   # torch.max -> NaN: kept
    (1.0, [0, NAN, 1], 56.0),     # NaN still in the window: kept
    (1.0, [0, 1, 1], 56.0),       # {1, NaN, 1} -> NaN: frozen (fused gives 448 here)
    (0.0, [0, 1, 0], 448.0),      # {0, 1, 1} -> 1
    (0.5, [0, 0, 0.5], 448.0),    # {0.5, 1, 0} -> 1
]
# L = 3, 'most_recent'.
FUSED_RECENT = [
    (4.0, [0, 0, 4], 112.0),
    (0.0, [0, 0, 4], 112.0),
    (INF, [0, 4, INF], 112.0),
    (NAN, [0, INF, NAN], 112.0),
    (2.0, [0, NAN, 2], 224.0),
]
UNFUSED_RECENT = [
    (4.0, [0, 0, 4], 112.0),
    (0.0, [0, 4, 0], 112.0),
    (INF, [0, 0, INF], 112.0),
    (NAN, [0, INF, NAN], 112.0),
    (2.0, [0, NAN, 2], 224.0),
]
SEQUENCES = {
    "fused-max": (True, "max", FUSED_MAX),
    "unfused-max": (False, "max", UNFUSED_MAX),
    "fused-most_recent": (True, "most_recent", FUSED_RECENT),
    "unfused-most_recent": (False, "most_recent", UNFUSED_RECENT),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_history_and_scale_after_each_update(name):
    fused, algo, steps = SEQUENCES[name]
    ds = DelayedScaling("e4m3", amax_history_len=3, amax_compute_algo=algo, fused=fused)
    assert same(ds.amax_history, [0, 0, 0]) and same(ds.scale, 1.0)
    for i, (amax, history, scale) in enumerate(steps):
        ds.update(amax)
        assert same(ds.amax_history, history), f"{name} step {i} amax={amax}: history {ds.amax_history.tolist()}"
        assert same(ds.scale, scale), f"{name} step {i} amax={amax}: scale {ds.scale.item()} != {scale}"


def test_pinned_zero_amax_fused_keeps_scale_unfused_recomputes_from_history():
    # reference_emulators.md section 8 item 18, L = 2: after amaxes 8 and 2 both hold 448/8;
    # a zero amax then leaves fused alone (no roll) while unfused takes max{0, 2} -> 224.
    fused = DelayedScaling(amax_history_len=2, fused=True)
    unfused = DelayedScaling(amax_history_len=2, fused=False)
    for ds in (fused, unfused):
        ds.update(8.0)
        ds.update(2.0)
        assert same(ds.scale, 56.0) and same(ds.amax_history, [0, 2])
        ds.update(0.0)
    assert same(fused.scale, 56.0) and same(fused.amax_history, [0, 2])
    assert same(unfused.scale, 224.0) and same(unfused.amax_history, [0, 0])


def test_tiny_amax_scale_is_flt_max_in_both_paths():
    for fused in (True, False):
        ds = DelayedScaling(amax_history_len=1, fused=fused)
        ds.update(2.0**-149)  # 448 / 2^-149 overflows float32
        assert same(ds.scale, FLT_MAX)


def test_margin_scale_and_the_pinned_overflow_order_difference():
    for fused in (True, False):
        ds = DelayedScaling(amax_history_len=1, margin=1, fused=fused)
        ds.update(8.0)
        assert same(ds.scale, 28.0)  # 448 / 2 / 8
    # Fused: (448 * 2^-1) / 2^-120 = 1.75 * 2^127, finite. Unfused: (448 / 2^-120) / 2^1
    # overflows in the first division (1.75 * 2^128 = Inf) and becomes FLT_MAX.
    fused, unfused = DelayedScaling(margin=1, fused=True), DelayedScaling(margin=1, fused=False)
    fused.update(2.0**-120)
    unfused.update(2.0**-120)
    assert same(fused.scale, 1.75 * 2.0**127)
    assert same(unfused.scale, FLT_MAX)


@pytest.mark.parametrize("length", [1, 2, 5])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_positive_amaxes_give_448_over_the_max_of_the_last_l(fused, algo, length, gen):
    # With every amax finite and > 0 both paths are a sliding window over the last L amaxes
    # (the current one and L-1 before it). Fused: one float32 division 448 / amax (the
    # float64 quotient rounded once is the same number). Unfused: TE's `fp8_max / amax` on
    # a tensor runs as amax.reciprocal() * 448, two float32 roundings.
    amaxes = (torch.rand(40, generator=gen) * 2.0 ** torch.randint(-10, 10, (40,), generator=gen)).tolist()
    ds = DelayedScaling(amax_history_len=length, amax_compute_algo=algo, fused=fused)
    for i, a in enumerate(amaxes):
        a32 = float(np.float32(a))
        ds.update(a32)
        window = [float(np.float32(v)) for v in amaxes[max(0, i - length + 1): i + 1]]
        ref = np.float32(max(window) if algo == "max" else a32)
        expected = np.float32(448.0 / float(ref)) if fused else np.float32(448) * (np.float32(1) / ref)
        assert same(ds.scale, float(expected)), f"step {i}"


def test_pinned_unfused_reciprocal_times_max_differs_from_fused_division():
    # amax = 10.674758911132812 (0x412acbd0): 448 / amax = 41.968162536621094 (0x4227df66)
    # in one rounding (fused kernel); fl32(1 / amax) * 448 = 41.96815872192383 (0x4227df65).
    fused, unfused = DelayedScaling(fused=True), DelayedScaling(fused=False)
    fused.update(10.674758911132812)
    unfused.update(10.674758911132812)
    assert fused.scale.view(torch.int32).item() == 0x4227DF66
    assert unfused.scale.view(torch.int32).item() == 0x4227DF65


def codes_e4m3(values: list[float]) -> list[int]:
    return np.clip(np.array(values, dtype=np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_quantize_uses_the_scale_from_the_previous_step(fused):
    ds = DelayedScaling("e4m3", amax_history_len=16, fused=fused)
    x1 = torch.tensor([2.0, -1.0, 0.5])
    x2 = torch.tensor([8.0, 1.0, -0.25])
    q1 = ds.quantize(x1)  # initial scale 1.0, whatever x1's amax
    assert same(q1.scale_inv, 1.0)
    assert q1.codes.tolist() == [0x40, 0xB8, 0x30]  # 2.0, -1.0, 0.5 at scale 1
    assert same(ds.scale, 224.0)  # from x1's amax 2, for the next step
    q2 = ds.quantize(x2)  # scale 224 (x1's), not 56 (x2's): 8 * 224 = 1792 saturates
    assert same(q2.scale, 224.0)
    assert q2.codes.tolist() == [0x7E, 0x76, 0xE6]  # 448 (saturated), 224, -56
    assert q2.codes.tolist() == codes_e4m3([1792.0, 224.0, -56.0])
    assert same(ds.scale, 56.0)
    q3 = ds.quantize(x2)  # now the scale from x2's amax 8
    assert q3.codes.tolist() == [0x7E, 0x66, 0xD6]  # 448, 56, -14
    assert same(q3.scale_inv, float(np.float32(1.0) / np.float32(56.0)))
    assert same(q3.amax, 8.0)


def test_quantize_records_the_nan_propagating_amax():
    ds = DelayedScaling(amax_history_len=2, fused=False)
    ds.quantize(torch.tensor([1.0, NAN]))
    assert same(ds.amax_history, [0, NAN]) and same(ds.scale, 1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fmt": "e2m1"}, ValueError, r"not an FP8 format"),
        ({"amax_history_len": 0}, ValueError, r"amax_history_len=0"),
        ({"amax_history_len": 2.0}, ValueError, r"amax_history_len=2.0"),
        ({"amax_compute_algo": "mean"}, ValueError, r"amax_compute_algo='mean'.*most_recent"),
        ({"margin": -2}, ValueError, r"margin=-2"),
        ({"margin": 0.5}, TypeError, r"margin must be an int"),
        ({"fused": "yes"}, TypeError, r"fused must be a bool"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        DelayedScaling(**kwargs)


def test_bad_update_and_quantize_inputs_raise():
    ds = DelayedScaling()
    with pytest.raises(ValueError, match=r"amax=-1.0 is negative"):
        ds.update(-1.0)
    with pytest.raises(ValueError, match=r"amax must be a scalar"):
        ds.update(torch.ones(2))
    with pytest.raises(TypeError, match=r"x.dtype=torch.int64"):
        ds.quantize(torch.ones(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"x.dtype=torch.float64"):
        ds.quantize(torch.ones(4, dtype=torch.float64))
    assert same(ds.scale, 1.0) and same(ds.amax_history, [0.0] * 1024)  # state untouched
