"""AITER's Triton MXFP4 quantizer as it ran on an NVIDIA H200, against the oracle.

The vector (``references/vectors/aiter_triton_mxfp4_h200.pt``) is what amd-aiter
0.1.7.post2.dev18's ``dynamic_mxfp4_quant`` wrote on an H200 (tools/h200/aiter_triton_probe.py,
2026-12-01) for bf16 rows scaled 1e-3..1e3: the kernel's own bits, not mxcheck's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mxcheck.packing import unpack_fp4
from mxcheck.profiles import get_profile

pytestmark = pytest.mark.emulated

VECTOR = Path(__file__).parent.parent / "references" / "vectors" / "aiter_triton_mxfp4_h200.pt"


@pytest.fixture(scope="module")
def kernel() -> dict[str, torch.Tensor]:
    v = torch.load(VECTOR)
    return {"x": v["x"], "codes": unpack_fp4(v["packed"]), "scales": v["scales"]}


def test_aiter_triton_codes_are_the_even_rule_with_ties_away(kernel):
    codes, _ = get_profile("aiter.mxfp4.triton").quantize(kernel["x"])
    assert torch.equal(codes, kernel["codes"])


def test_aiter_triton_codes_are_not_ties_to_even(kernel):
    # The finding's other half: an RNE packer differs from the kernel, only at midpoints.
    codes, _ = get_profile("primus_turbo.mxfp4").quantize(kernel["x"])
    differ = codes != kernel["codes"]
    assert 0 < int(differ.sum()) < codes.numel() // 100


def test_aiter_triton_on_h200_stores_byte_127_for_every_negative_block_exponent(kernel):
    # Finding: `scale_e8m0_unbiased.to(tl.uint8) + 127` turns a negative float exponent into
    # an unsigned byte; NVIDIA saturates it to 0, so the kernel stores 2^0 where it means
    # 2^e, e < 0, while the codes were made with 2^e (test above): dequantizing gives
    # values 2^-e too large. Blocks with e >= 0 carry the even rule's byte.
    _, want = get_profile("aiter.mxfp4.triton").quantize(kernel["x"])
    negative = want < 127
    assert 0 < int(negative.sum()) < want.numel()
    assert torch.equal(kernel["scales"][~negative], want[~negative])
    assert bool((kernel["scales"][negative] == 127).all())


def test_the_unsigned_exponent_range_is_the_kernel_on_h200_bit_for_bit(kernel):
    # mxcheck's model of the finding above (profile field exponent_range="unsigned", which the
    # attribution catalogue names) against the kernel's own bytes: codes and scales.
    from dataclasses import replace

    codes, scales = replace(get_profile("aiter.mxfp4.triton"), exponent_range="unsigned").quantize(kernel["x"])
    assert torch.equal(codes, kernel["codes"])
    assert torch.equal(scales, kernel["scales"])
