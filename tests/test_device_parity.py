"""The oracles give the same bits on a CUDA device as on the CPU, eager and compiled.

The float path of encode uses torch's own fp8 conversion for RNE into e4m3/e5m2; these
tests are what shows the CUDA conversion agrees with the CPU one (and with the integer
path, which test_encode_paths.py holds it to on the CPU).
"""

from __future__ import annotations

import pytest
import torch

import mxcheck
from mxcheck.formats import encode_bits_int
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS
from tests.test_encode_paths import FAST_FORMATS, hard_points
from tests.test_mx import varied_blocks

pytestmark = pytest.mark.cuda

RULES = ("floor", "ceil", "even", "rceil")


@pytest.mark.parametrize("rounding", ("rne", "half_away", "trunc"))
@pytest.mark.parametrize("fmt", FAST_FORMATS, ids=str)
def test_encode_on_cuda_equals_the_cpu_integer_path(fmt, rounding, gen):
    x = hard_points(fmt, gen)
    got = mxcheck.formats.encode_bits(x.cuda(), fmt, rounding, True, None).cpu()
    assert torch.equal(got, encode_bits_int(x, fmt, rounding, True, None))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_mx_quantize_on_cuda_equals_cpu(fmt, rule, gen):
    x = (torch.randn(256, 512, generator=gen) * torch.exp2(torch.randint(-30, 30, (256, 1), generator=gen).float()))
    x[3, 5] = float("inf")
    x[7, 100] = float("nan")
    cpu = mxcheck.mx_quantize(x, fmt, scale_rule=rule)
    gpu = mxcheck.mx_quantize(x.cuda(), fmt, scale_rule=rule)
    assert torch.equal(gpu.scales.cpu(), cpu.scales) and torch.equal(gpu.codes.cpu(), cpu.codes)


@pytest.mark.parametrize(("fmt", "rule"), [("e2m1", "even"), ("e4m3", "rceil"), ("e2m3", "floor")])
def test_compiled_mx_quantize_equals_eager_cpu(fmt, rule, gen):
    # varied_blocks plants amax at and around powers of two and element maxima: where a
    # compiler's rewrites (Inductor turns x / c into x * (1/c)) would move a scale.
    x = varied_blocks(gen)
    compiled = torch.compile(lambda t: mxcheck.mx_quantize(t, fmt, scale_rule=rule))
    a, b = compiled(x.cuda()), mxcheck.mx_quantize(x, fmt, scale_rule=rule)
    assert torch.equal(a.scales.cpu(), b.scales) and torch.equal(a.codes.cpu(), b.codes)


@pytest.mark.parametrize("rows", [1, 32])
def test_block_amax_on_cuda_equals_cpu_with_nan_and_inf(rows, gen):
    from mxcheck.scaling.blocks import block_amax

    x = torch.randn(3, 64, 96, generator=gen).bfloat16()
    x[0, 1, 2] = float("nan")
    x[1, 40, 70] = -float("inf")
    cpu, gpu = block_amax(x, rows, 32), block_amax(x.cuda(), rows, 32).cpu()
    assert cpu.shape == gpu.shape == (3, 64 // rows, 3)
    assert torch.equal(cpu.nan_to_num(nan=-1.0), gpu.nan_to_num(nan=-1.0))
    assert torch.isnan(gpu).sum().item() == 1 and torch.isinf(gpu).sum().item() == 1


@pytest.mark.parametrize(("fmt", "rule"), [("e2m1", "even"), ("e4m3", "rceil"), ("e2m3", "floor")])
def test_emulated_gemm_bf16_fast_path_within_fp32_bound_of_exact(fmt, rule, gen):
    from mxcheck.gemm import emulated_gemm, mx_fits_bf16

    x, w = torch.randn(256, 512, generator=gen), torch.randn(384, 512, generator=gen)
    a, b = mxcheck.mx_quantize(x.cuda(), fmt, scale_rule=rule), mxcheck.mx_quantize(w.cuda(), fmt, scale_rule=rule)
    assert mx_fits_bf16(a) and mx_fits_bf16(b)  # the premise: the fast path runs
    got = emulated_gemm(a, b, out_dtype=torch.float32).double().cpu()
    exact = emulated_gemm(a, b, out_dtype=torch.float64, accumulate=torch.float64).cpu()
    da, db = a.dequantize().double().abs().cpu(), b.dequantize().double().abs().cpu()
    assert ((got - exact).abs() <= 512 * 2.0**-24 * (da @ db.T)).all()


@pytest.mark.parametrize(("fmt", "rule", "fused", "reads"), [("e2m1", "even", "1", 0), ("e4m3", "rceil", "1", 0),
                                                            ("e2m1", "even", "0", 0), ("e4m3", "rceil", "0", 2)])
def test_emulated_gemm_picks_its_path_without_waiting_for_the_device(fmt, rule, fused, reads, gen, monkeypatch):
    # Each device-to-host read waits for the GPU to drain. With the Triton kernels the path
    # is picked on the device (tests/test_gemm_inexact.py). Without them (MXCHECK_FUSED_MX=0):
    # e2m1 fits bf16 at every byte, no read; e4m3 reads both operands' smallest bytes, and
    # then the codes, because a byte is below bf16's range (the all-zero blocks' byte 0).
    # torch's sync debug mode warns once per synchronizing call.
    import warnings

    from mxcheck.gemm import emulated_gemm

    if fused == "1":
        pytest.importorskip("triton")
    monkeypatch.setenv("MXCHECK_FUSED_MX", fused)

    x, w = torch.randn(256, 512, generator=gen), torch.randn(384, 512, generator=gen)
    x[:, :64] = 0.0
    a, b = mxcheck.mx_quantize(x.cuda(), fmt, scale_rule=rule), mxcheck.mx_quantize(w.cuda(), fmt, scale_rule=rule)
    emulated_gemm(a, b)  # compile the Triton kernels first: steady state is what counts
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            emulated_gemm(a, b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # the prototype notice ("...does not yet detect all synchronizing operations") comes once
    # per process, in whichever test sets the mode first: count only the calls
    got = [str(c.message) for c in caught if "called a synchronizing" in str(c.message)]
    assert len(got) == reads, got


@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_triton_bf16_dequantize_equals_float32_path_on_every_byte(fmt, gen):
    """The fused Triton dequantization gives the float32 path's values rounded once to bf16,
    for every code and every E8M0 byte (0 = 2**-127, 254, 255 = NaN), padded or not."""
    pytest.importorskip("triton")
    from mxcheck.formats import decode_table, get_format
    from mxcheck.scaling.mx import MXTensor
    from mxcheck.scaling.mx_cuda import dequantize_bf16

    f = get_format(fmt)
    codes = torch.randint(0, 2**f.bits, (64, 256), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.arange(512, dtype=torch.int32).remainder(256).reshape(64, 8).to(torch.uint8)
    q = MXTensor(codes.cuda(), scales.cuda(), f, 32, 1, (64, 250), "floor", "rne")
    want = q.dequantize(padded=True, dtype=torch.float32).to(torch.bfloat16)
    got = dequantize_bf16(q.codes, q.scales, decode_table(f, "cuda"), 32)
    assert got is not None
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    unpadded = q.dequantize(dtype=torch.bfloat16)  # through MXTensor: the fused path
    assert unpadded.shape == (64, 250)
    torch.testing.assert_close(unpadded, want[:, :250], rtol=0, atol=0, equal_nan=True)
