"""The fused Triton FP8 encode (``mxcheck.scaling.mx_cuda.scaled_encode``, which
``fp8_quantize`` and ``DelayedScaling.quantize`` take on CUDA) gives the torch path's codes,
bit for bit, on every code, tie, special value and scale layout.

On CUDA (``-m cuda``) every FP8 format, granularity and scale formula is compared with the
CPU torch path, for float32, bf16 and fp16 inputs, and the delayed-scaling path (a scale held
on the CPU). On a CPU machine with Triton installed, a few float32 cases run in Triton's
interpreter (``emulated``; ``TRITON_INTERPRET=1`` at start); without Triton they skip.
"""

from __future__ import annotations

import math

import pytest
import torch

import mxcheck
from mxcheck.formats import decode_table, encode_bits, get_format
from mxcheck.scaling import mx_cuda
from mxcheck.scaling.fp8 import FP8_FORMATS, FP8_GRANULARITIES, _blockwise
from tests.test_encode_paths import hard_points
from tests.test_mx import varied_blocks
from tests.test_mx_fused import interpreted  # noqa: F401  (the fixture the interpreter tests use)

FORMULAS = {"te": {}, "te_power_of_2": {"power_of_2": True}, "primus_turbo": {"scale_formula": "primus_turbo"}}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
K = 256  # two 1x128 blocks per row; tiles of 128 rows
# The tile exponents of the tie input: x = (a format value, midpoint or neighbour) * 2**k in
# a tile whose amax is fmt.max * 2**k, so each block's scale is 2**-k (te, power of two or
# not, and primus_turbo alike) and x * scale lands on the point exactly. Every 2**-k is a
# finite float32 (te maps an Inf scale to another value) and, for float16, every point of
# the tile stays a float16 number down to the smallest subnormals of e4m3 and e5m2.
TILE_EXPONENTS = {torch.float32: (-127, -64, -3, 0, 5, 100), torch.bfloat16: (-127, -64, -3, 0, 5, 100),
                  torch.float16: (-8, -3, 0)}
_QUIET_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype, each NaN keeping its sign (torch's float32 -> bf16 cast makes every NaN
    0xFFFF, negative)."""
    y = x.to(dtype)
    if dtype not in _QUIET_NAN_BITS:
        return y
    nan = torch.full_like(y.view(torch.int16), _QUIET_NAN_BITS[dtype])
    nan = torch.where(torch.signbit(x), nan | -0x8000, nan)
    return torch.where(torch.isnan(x), nan, y.view(torch.int16)).view(dtype)


def _tiles(rows: torch.Tensor) -> torch.Tensor:
    """(R, K) padded with zero rows to a multiple of 128 rows."""
    pad = -rows.shape[0] % 128
    return torch.cat([rows, torch.zeros(pad, rows.shape[1])]) if pad else rows


def tie_tiles(fmt: str, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """One 128 x K tile per exponent k of TILE_EXPONENTS[dtype]: the finite hard points
    (values, midpoints, their float32 neighbours, random values; each at least once, then
    drawn at random) times 2**k, and +-fmt.max * 2**k leading each 128-column block, so every
    block of every granularity has amax fmt.max * 2**k."""
    f = get_format(fmt)
    points = hard_points(f, gen)
    points = points[torch.isfinite(points)].clamp(-f.max, f.max)
    body_cols = [c for c in range(K) if c % 128]
    tiles = []
    for k in TILE_EXPONENTS[dtype]:
        body = points[torch.randint(0, points.numel(), (128, len(body_cols)), generator=gen)]
        body.view(-1)[: points.numel()] = points
        tile = torch.empty(128, K)
        tile[:, body_cols] = body
        tile[:, ::128] = torch.where(torch.rand(128, K // 128, generator=gen) < 0.5, -f.max, f.max)
        tiles.append((tile.double() * 2.0**k).float())
    return torch.cat(tiles)


def special_tiles(fmt: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``infinities``, tiles of: zeros of both signs; Inf of both signs among values beyond
    max (te's scale for an Inf amax is 1; primus_turbo's is 0, and Inf * 0 is NaN); values
    far beyond max and at max; float32 subnormals only (te's scale overflows to its Inf
    value). ``nans``: NaN of both signs among finite values, then a tile of one special row
    kind per row. Apart, so that a whole-tensor amax is Inf in one, NaN in the other."""
    f = get_format(fmt)
    r = torch.randn(128, K, generator=gen)
    zeros = torch.where(r < 0, -0.0, 0.0)
    infs = r * f.max * 4
    infs[:, 3], infs[:, 130], infs[::2, 7] = math.inf, -math.inf, -math.inf
    beyond = r * f.max * 1000
    beyond[:, ::9] = f.max * torch.sign(r[:, ::9])
    subnormal = r * 2.0**-140
    nans = r.clone()
    nans[:, 5], nans[:, 200], nans[::3, 17] = math.nan, -math.nan, -math.nan
    mixed = torch.cat([zeros[:32], infs[:32], nans[:32], beyond[:16], subnormal[:16]])
    return {"infinities": torch.cat([zeros, infs, beyond, subnormal]), "nans": torch.cat([nans, mixed])}


def fp8_inputs(fmt: str, gen: torch.Generator, dtype: torch.dtype = torch.float32, *,
               all_bf16: bool = True) -> dict[str, torch.Tensor]:
    """(M, K) inputs in dtype, M a multiple of 128, each quantized on its own (a whole-tensor
    scale sees one of them): ``ties`` (tie_tiles); ``normal`` and ``varied`` (test_mx's
    varied_blocks), whose scales are not powers of two, so the float32 multiply rounds;
    ``infinities`` and ``nans`` (special_tiles); ``bf16``, every bf16 bit pattern, in order
    and shuffled."""
    inputs = {"ties": tie_tiles(fmt, gen, dtype), "normal": torch.randn(256, K, generator=gen) * 3,
              "varied": _tiles(varied_blocks(gen).reshape(-1, K)), **special_tiles(fmt, gen)}
    if all_bf16:
        patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        perm = torch.randperm(patterns.numel(), generator=gen)
        both = torch.cat([patterns, patterns[perm]]).reshape(-1, K)
        inputs["bf16"] = both if dtype == torch.bfloat16 else cast(both.float(), dtype)
    return {name: x if name == "bf16" else cast(x, dtype) for name, x in inputs.items()}


def assert_codes_equal(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: str) -> None:
    bad = (got != want).nonzero()
    assert not len(bad), (f"{what}: {len(bad)} of {got.numel()} codes differ; first at {bad[0].tolist()}: "
                          f"x={x[tuple(bad[0])].item()!r} fused {got[tuple(bad[0])]} torch {want[tuple(bad[0])]}")


def assert_fused_equals_torch_path(x: torch.Tensor, device: str, fmt: str, granularity: str, formula: str,
                                   monkeypatch, what: str) -> None:
    kw = FORMULAS[formula]
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    want = mxcheck.fp8_quantize(x, fmt, granularity=granularity, **kw)  # CPU: the torch path
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    got = mxcheck.fp8_quantize(x.to(device), fmt, granularity=granularity, **kw)
    # the scales are torch's on both sides; equal scales put any code difference on the encode
    assert torch.equal(got.scale.cpu().view(torch.int32), want.scale.view(torch.int32)), f"{what}: scales differ"
    assert_codes_equal(got.codes.cpu(), want.codes, x, what)


def scaled_products(x: torch.Tensor, fmt: str, granularity: str, formula: str) -> torch.Tensor:
    """float32 x * scale, as the encode sees it (the torch path's one multiply)."""
    q = mxcheck.fp8_quantize(x, fmt, granularity=granularity, **FORMULAS[formula])
    return _blockwise(lambda xc, sc: xc.to(torch.float32) * sc, x, q.scale, FP8_GRANULARITIES[granularity])


def midpoints(fmt: str) -> torch.Tensor:
    values = decode_table(get_format(fmt)).double().abs()
    values = torch.unique(values[torch.isfinite(values)])
    return ((values[1:] + values[:-1]) / 2).float()  # exact: one bit more than the format


@pytest.mark.emulated
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fp8_fused_inputs_hit_every_tie(fmt, dtype, gen):
    """The premise of the equivalence tests: x * scale lands exactly on every midpoint of the
    format (every RNE tie), of both signs, for every granularity, scale formula and input
    dtype, and on ties many times."""
    x = tie_tiles(fmt, gen, dtype)
    mids = torch.cat([-midpoints(fmt).flip(0), midpoints(fmt)])  # ascending
    for granularity in FP8_GRANULARITIES:
        for formula in FORMULAS:
            a = scaled_products(x, fmt, granularity, formula).flatten()
            ties = a[mids[torch.searchsorted(mids, a).clamp(max=mids.numel() - 1)] == a]
            assert bool(torch.isin(mids, ties).all()), (granularity, formula)
            assert ties.numel() > 1000, (granularity, formula, ties.numel())


@pytest.mark.emulated
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fp8_fused_inputs_hold_the_special_values(fmt, gen):
    """And they hold NaN, Inf and zeros of both signs, subnormals, products beyond max (te),
    and a zero scale (primus_turbo's for an Inf amax: Inf * 0 is NaN), for every granularity."""
    x = special_tiles(fmt, gen)
    specials = torch.cat([x["infinities"], x["nans"]])
    bits = specials.view(torch.int32)
    for pattern in (0x7FC00000, -0x00400000, 0x7F800000, -0x00800000, 0, -0x80000000):  # +-NaN, +-Inf, +-0
        assert bool((bits == pattern).any()), hex(pattern)
    assert bool(((specials != 0) & (specials.abs() < torch.finfo(torch.float32).tiny)).any())
    for granularity in FP8_GRANULARITIES:
        for name in ("infinities", "nans"):
            a = scaled_products(x[name], fmt, granularity, "te")
            assert bool(((a.abs() > get_format(fmt).max) & a.isfinite()).any()), (granularity, name)
        q = mxcheck.fp8_quantize(x["infinities"], fmt, granularity=granularity, scale_formula="primus_turbo")
        assert bool((q.scale == 0).any()), granularity


@pytest.mark.emulated
@pytest.mark.parametrize(("dtype", "bits"), [(torch.bfloat16, [0x7FC0, -0x0040, 0x3FC0]),
                                             (torch.float16, [0x7E00, -0x0200, 0x3E00])], ids=str)
def test_cast_keeps_the_sign_of_a_nan(dtype, bits):
    # the premise of the 16-bit inputs: they hold NaNs of both signs (0xFFC0 and 0xFE00 for -NaN)
    assert cast(torch.tensor([math.nan, -math.nan, 1.5]), dtype).view(torch.int16).tolist() == bits


@pytest.mark.emulated
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_torch_path_keeps_the_sign_of_a_float16_nan_in_every_lane(fmt, monkeypatch):
    # torch's CPU float16 -> float32 cast keeps a NaN's sign in its vector lanes and drops it
    # in a run's scalar tail (21 elements: a tail here); the torch path puts it back, as the
    # kernel keeps it. Witness: torch's own float16 -> fp8 cast (0x7F / 0xFF for +-NaN).
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    x = torch.tensor([0x7E00, -0x0200] * 10 + [0x3C00], dtype=torch.int16).view(torch.float16)
    q = mxcheck.fp8_quantize(x, fmt)
    assert q.scale.item() == 1.0  # te: a NaN amax gives scale 1
    assert q.codes.tolist() == x.to(get_format(fmt).torch_dtype).view(torch.uint8).tolist()


# ------------------------------------------------------------------ CUDA: every case

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("formula", FORMULAS)
@pytest.mark.parametrize("granularity", FP8_GRANULARITIES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fused_fp8_encode_equals_the_torch_path(fmt, granularity, formula, dtype, gen, monkeypatch):
    pytest.importorskip("triton")
    for name, x in fp8_inputs(fmt, gen, dtype).items():
        assert_fused_equals_torch_path(x, "cuda", fmt, granularity, formula, monkeypatch, name)


def delayed_steps(inputs: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The inputs in an order for a one-step amax history: each scale is fmax / the previous
    amax (kept where that is not finite > 0): 1, then normal's (not a power of two: the
    multiply rounds), then 2**-k of the ties' largest tile (ties hit), then varied's (its
    amax is FLT_MAX) and what the specials leave."""
    order = ["normal", "normal", "ties", "ties", "varied", "infinities", "nans", "bf16", "normal"]
    return [(f"step {i} ({name})", inputs[name]) for i, name in enumerate(order) if name in inputs]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fused_delayed_scaling_with_its_cpu_scale_equals_the_torch_path(fmt, dtype, gen, monkeypatch):
    """DelayedScaling keeps its scale on the CPU: the kernel takes it by value. Steps over
    every input (delayed_steps), so the scale moves between them."""
    pytest.importorskip("triton")
    cpu, gpu = mxcheck.DelayedScaling(fmt, amax_history_len=1), mxcheck.DelayedScaling(fmt, amax_history_len=1)
    for name, x in delayed_steps(fp8_inputs(fmt, gen, dtype)):
        monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
        want = cpu.quantize(x)
        monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
        assert gpu.scale.device.type == "cpu"
        got = gpu.quantize(x.cuda())
        assert torch.equal(got.scale.view(torch.int32), want.scale.view(torch.int32)), name
        assert_codes_equal(got.codes.cpu(), want.codes, x, f"{name} (scale {want.scale.item()!r})")


def tile_scales(x: torch.Tensor, dtype: torch.dtype, factor: float) -> torch.Tensor:
    """(M / 128, 1): tie_tiles' 2**-k per tile, times factor (1: ties hit; else the multiply rounds)."""
    return torch.tensor([[2.0**-k * factor] for k in TILE_EXPONENTS[dtype]])


@pytest.mark.cuda
@pytest.mark.parametrize("factor", [1.0, 1.375])
@pytest.mark.parametrize("fmt", ["e2m1", "e2m3", "e3m2"])
def test_fused_scaled_encode_takes_the_small_formats(fmt, factor, gen):
    """Any signed format of <= 8 bits: the codes of encode_bits(float32(x) * scale), here with
    a scale per 128 whole rows (a layout no FP8 granularity has)."""
    pytest.importorskip("triton")
    x = tie_tiles(fmt, gen, torch.float32)
    scale = tile_scales(x, torch.float32, factor)
    got = mx_cuda.scaled_encode(x.cuda(), scale.cuda(), get_format(fmt), 128, None)
    assert got is not None
    want = encode_bits(x * scale.repeat_interleave(128, dim=0), get_format(fmt), "rne", True)
    assert_codes_equal(got.cpu(), want, x, fmt)


@pytest.mark.cuda
def test_fused_fp8_encode_runs_on_cuda_and_can_be_switched_off(gen, monkeypatch):
    """The fast path is taken and MXCHECK_FUSED_MX=0 turns it off, so the tests above compare
    two different paths; a scale that is not float32 (the torch path would multiply in its
    dtype) and an unsigned format are left to the torch path."""
    pytest.importorskip("triton")
    x = torch.randn(128, 128, generator=gen).cuda()
    scale = torch.tensor(2.0, device="cuda")
    f = get_format("e4m3")
    assert mx_cuda.scaled_encode(x, scale, f, None, None) is not None
    assert mx_cuda.scaled_encode(x, scale.double(), f, None, None) is None
    assert mx_cuda.scaled_encode(x, scale, get_format("e8m0"), None, None) is None
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    assert mx_cuda.scaled_encode(x, scale, f, None, None) is None


# ------------------------------------------------------------------ CPU: Triton's interpreter
# float32 inputs only: the interpreter (numpy) widens bf16 subnormals and rounds float32 to
# bf16 its own way, which the GPU does not (the cuda tests above take every dtype).

INTERPRETED = [("e4m3", "block128x128", "te"), ("e5m2", "row", "primus_turbo"),
               ("e4m3fnuz", "block1x128", "te_power_of_2"), ("e5m2fnuz", "tensor", "te"),
               ("e4m3", "tensor", "primus_turbo")]


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize(("fmt", "granularity", "formula"), INTERPRETED)
def test_fused_fp8_encode_in_the_interpreter_equals_the_torch_path(fmt, granularity, formula, monkeypatch, gen):
    for name, x in fp8_inputs(fmt, gen).items():
        monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
        want = mxcheck.fp8_quantize(x, fmt, granularity=granularity, **FORMULAS[formula])
        monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
        g = FP8_GRANULARITIES[granularity]
        got = mx_cuda.scaled_encode(x, want.scale, get_format(fmt), g.rows, g.cols)
        assert got is not None
        assert_codes_equal(got, want.codes, x, name)


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
def test_fused_delayed_scaling_in_the_interpreter_equals_the_torch_path(monkeypatch, gen):
    cpu, fused = mxcheck.DelayedScaling("e4m3", amax_history_len=1), mxcheck.DelayedScaling("e4m3", amax_history_len=1)
    for name, x in delayed_steps(fp8_inputs("e4m3", gen, all_bf16=False)):
        monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
        want = cpu.quantize(x)
        monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
        got = fused.quantize(x)
        assert torch.equal(got.scale.view(torch.int32), want.scale.view(torch.int32)), name
        assert_codes_equal(got.codes, want.codes, x, name)


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize("factor", [1.0, 1.375])
def test_fused_scaled_encode_in_the_interpreter_takes_a_small_format(factor, gen):
    x = tie_tiles("e2m3", gen, torch.float32)
    scale = tile_scales(x, torch.float32, factor)
    got = mx_cuda.scaled_encode(x, scale, get_format("e2m3"), 128, None)
    assert got is not None
    want = encode_bits(x * scale.repeat_interleave(128, dim=0), get_format("e2m3"), "rne", True)
    assert_codes_equal(got, want, x, "e2m3")


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
def test_fused_scaled_encode_rejects_scales_that_do_not_tile_x():
    x = torch.ones(256, 256)
    with pytest.raises(ValueError, match=r"scale of shape \(2, 3\) does not tile x of shape \(256, 256\)"):
        mx_cuda.scaled_encode(x, torch.ones(2, 3), get_format("e4m3"), 128, 128)


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize("shape", [(0,), (0, 128), (3, 0)])
def test_fused_scaled_encode_in_the_interpreter_of_an_empty_tensor_is_empty(shape):
    got = mx_cuda.scaled_encode(torch.empty(shape), torch.tensor(1.0), get_format("e4m3"), None, None)
    assert got is not None and got.dtype == torch.uint8 and got.shape == shape
