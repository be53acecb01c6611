"""The CUDA MX GEMM picks its path on the device: the bf16 dequantization flags a value bf16
cannot hold (``mx_fits_bf16``'s rule), and then a float32 GEMM from the exact values
overwrites the bf16 GEMM's result (``mx_cuda.gemm_f32_where_inexact``).

The flag is held to the host rule at every scale byte; the flagged GEMM is held to float64
truth on operands where each output is one exact product (so any float32 order gives the
same bits), and the bf16 GEMM alone is shown to get those outputs wrong. ``cuda`` tests run
on a GPU; the ``emulated`` ones run the same kernels in Triton's interpreter on a CPU
(``TRITON_INTERPRET=1`` at start; skipped otherwise).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from mxcheck.formats import decode_table, get_format
from mxcheck.gemm import _bf16_lowest_byte, emulated_gemm, mx_fits_bf16
from mxcheck.scaling import mx_cuda
from mxcheck.scaling.mx import MX_ELEMENT_FORMATS, MXTensor
from tests.test_mx_fused import interpreted  # noqa: F401  (a fixture)


def block(fmt, codes: torch.Tensor, byte: int) -> MXTensor:
    return MXTensor(codes[None], torch.tensor([[byte]], dtype=torch.uint8), fmt, 32, 1, (1, 32), "floor", "rne")


def flag_at_every_byte(fmt: str, device: str) -> tuple[list[bool], list[bool]]:
    """(the device flag, not mx_fits_bf16) for a block of the smallest and largest nonzero
    codes under every byte 0..255; a block of +0 and -0 codes is never flagged."""
    f = get_format(fmt)
    ends = torch.tensor([1, f.max_code] * 16, dtype=torch.uint8)
    zeros = torch.tensor([0, 1 << (f.bits - 1)] * 16, dtype=torch.uint8)
    table = decode_table(f, torch.device(device))
    flagged, refused, zero_flagged = [], [], []
    for byte in range(256):
        for codes, out in ((ends, flagged), (zeros, zero_flagged)):
            q = block(f, codes, byte)
            inexact = torch.zeros(1, dtype=torch.int32, device=device)
            mx_cuda.dequantize_bf16(q.codes.to(device), q.scales.to(device), table, 32, inexact=inexact,
                                    lowest_byte=max(0, _bf16_lowest_byte(f)), magnitude_mask=f.magnitude_mask)
            out.append(bool(inexact.item()))
        refused.append(not mx_fits_bf16(block(f, ends, byte)))
    assert not any(zero_flagged)  # zeros are exact at every byte
    return flagged, refused


def one_term_operands(fmt: str, tiny_bytes: bool, m: int = 64, n: int = 48):
    """MX operands A (m x m) and B (n x m) where A is nonzero only on its diagonal, so each
    output is one product (exact in float32, as every float32 order of summing it). With
    ``tiny_bytes`` A's blocks take bytes 0-2, where fp8 elements are below bf16's range."""
    f = get_format(fmt)
    gen = torch.Generator().manual_seed(7)
    nonzero = torch.tensor([c for c in range(1, f.max_code + 1) if c & f.magnitude_mask and c != f.nan_code])
    a_codes = torch.zeros(m, m, dtype=torch.uint8)
    a_codes[torch.arange(m), torch.arange(m)] = nonzero[torch.randint(len(nonzero), (m,), generator=gen)].to(torch.uint8)
    a_bytes = (torch.randint(0, 3, (m, m // 32), generator=gen) if tiny_bytes
               else torch.randint(100, 140, (m, m // 32), generator=gen)).to(torch.uint8)
    b_codes = nonzero[torch.randint(len(nonzero), (n, m), generator=gen)].to(torch.uint8)
    b_bytes = torch.randint(190, 200, (n, m // 32), generator=gen).to(torch.uint8)
    a = MXTensor(a_codes, a_bytes, f, 32, 1, (m, m), "floor", "rne")
    b = MXTensor(b_codes, b_bytes, f, 32, 1, (n, m), "floor", "rne")
    exact = (a.dequantize().double() @ b.dequantize().double().T).float()
    return a, b, exact


FP8_ELEMENTS = [f for f in MX_ELEMENT_FORMATS if get_format(f).bits == 8]


# ------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", MX_ELEMENT_FORMATS)
def test_the_device_flag_is_mx_fits_bf16_at_every_byte(fmt):
    pytest.importorskip("triton")
    flagged, refused = flag_at_every_byte(fmt, "cuda")
    assert flagged == refused
    assert any(flagged) == (get_format(fmt).bits == 8)  # the premise: fp8 elements get flagged


@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FP8_ELEMENTS)
def test_values_below_bf16_range_are_summed_exactly_with_no_device_read(fmt, out_dtype):
    pytest.importorskip("triton")
    a, b, exact = one_term_operands(fmt, tiny_bytes=True)
    a, b = (MXTensor(q.codes.cuda(), q.scales.cuda(), q.fmt, 32, 1, q.shape, "floor", "rne") for q in (a, b))
    emulated_gemm(a, b, out_dtype=out_dtype)  # compile the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = emulated_gemm(a, b, out_dtype=out_dtype)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not [c for c in caught if "called a synchronizing" in str(c.message)]
    # one product of <= 4 + 4 significant bits per output: exact in float32 and in bf16
    assert torch.equal(got.cpu(), exact.to(out_dtype))
    # the premise: the bf16 GEMM alone loses these values
    alone = (a.dequantize(dtype=torch.bfloat16) @ b.dequantize(dtype=torch.bfloat16).T).float().cpu()
    assert not torch.equal(alone, exact)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FP8_ELEMENTS)
def test_an_exact_bf16_gemm_is_left_as_cublas_computed_it(fmt):
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(3)
    import mxcheck

    x, w = torch.randn(256, 512, generator=gen), torch.randn(384, 512, generator=gen)
    x[:, :64] = 0.0  # all-zero blocks: byte 0 with zero codes is exact
    a, b = mxcheck.mx_quantize(x.cuda(), fmt, scale_rule="rceil"), mxcheck.mx_quantize(w.cuda(), fmt, scale_rule="rceil")
    got = emulated_gemm(a, b, out_dtype=torch.float32)
    want = torch.mm(a.dequantize(dtype=torch.bfloat16), b.dequantize(dtype=torch.bfloat16).T, out_dtype=torch.float32)
    assert torch.equal(got, want)


# ------------------------------------------------------------------ CPU: Triton's interpreter


@pytest.mark.emulated
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_the_flag_in_the_interpreter_is_mx_fits_bf16_at_every_byte(fmt, interpreted):  # noqa: F811
    flagged, refused = flag_at_every_byte(fmt, "cpu")
    assert flagged == refused
    assert any(flagged) == (get_format(fmt).bits == 8)


@pytest.mark.emulated
@pytest.mark.parametrize("tiny_bytes", [True, False], ids=["flagged", "not-flagged"])
def test_the_fallback_gemm_in_the_interpreter_overwrites_only_when_flagged(tiny_bytes, interpreted):  # noqa: F811
    a, b, exact = one_term_operands("e4m3", tiny_bytes)
    operands = [(q.codes, q.scales, decode_table(q.fmt, torch.device("cpu")), 32) for q in (a, b)]
    sentinel = torch.full(exact.shape, 7.0)
    y = sentinel.clone()
    inexact = torch.tensor([int(tiny_bytes)], dtype=torch.int32)
    assert mx_cuda.gemm_f32_where_inexact(inexact, *operands, y)
    assert torch.equal(y, exact if tiny_bytes else sentinel)
