"""Triton tl.dot_scaled MX GEMMs against the oracle (runs on an NVIDIA GPU, sm90+)."""

from __future__ import annotations

import pytest
import torch

import mxcheck
from mxcheck.backends.triton_mx import triton_mx_gemm
from mxcheck.thresholds import gemm_floor

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize(("fmt", "rule"), [("e2m1", "even"), ("e2m1", "floor"), ("e4m3", "rceil"), ("e5m2", "rceil")])
@pytest.mark.parametrize(("m", "n", "k"), [(256, 384, 512), (200, 136, 256)])
def test_dot_scaled_gemm_within_fp32_accumulation_of_the_exact_product(fmt, rule, m, n, k, gen, numerics):
    x = torch.randn(m, k, generator=gen).cuda()
    w = torch.randn(n, k, generator=gen).cuda()
    a, b = mxcheck.mx_quantize(x, fmt, scale_rule=rule), mxcheck.mx_quantize(w, fmt, scale_rule=rule)
    exact = a.dequantize().double() @ b.dequantize().double().T
    got = triton_mx_gemm(a, b, out_dtype=torch.float32).double()
    # fp32 accumulation over K terms: |err| <= K * 2^-24 * sum_k |a_mk b_nk| (a loose, standard bound)
    bound = k * 2.0**-24 * (a.dequantize().double().abs() @ b.dequantize().double().abs().T)
    assert ((got - exact).abs() <= bound).all()
    numerics.context(backend="triton", recipe=f"mx-{fmt}-{rule}", layer=f"random {m}x{n}x{k}", direction="fwd",
                     m=m, n=n, k=k).snr(got, (x.double() @ w.double().T), gemm_floor(f"mx/{fmt}"))


def test_dot_scaled_matches_dequantize_to_bf16_and_matmul(gen):
    x = torch.randn(512, 1024, generator=gen).cuda()
    w = torch.randn(768, 1024, generator=gen).cuda()
    a, b = mxcheck.mx_quantize(x, "e2m1", scale_rule="even"), mxcheck.mx_quantize(w, "e2m1", scale_rule="even")
    fast = a.dequantize().bfloat16() @ b.dequantize().bfloat16().T
    got = triton_mx_gemm(a, b, out_dtype=torch.bfloat16)
    same = (got.view(torch.int16) == fast.view(torch.int16)).float().mean().item()
    print(f"triton dot_scaled vs bf16 dequant+matmul: {same * 100:.3f}% of outputs bit-identical")
    torch.testing.assert_close(got.float(), fast.float(), rtol=2**-7, atol=1e-2)
