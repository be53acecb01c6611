"""Poison checks fail a backend that reads memory it does not own or did not write."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import CHECKS
from mxcheck.conformance.poison import _guard_poisoned
from mxcheck.layouts import MXFP6_GUARD_K_TILES, mxfp6_blob_sizes, pack_mxfp6_blob
from mxcheck.recipes import RECIPES

pytestmark = pytest.mark.emulated


class _IgnoresStrides(EmulatedBackend):
    """Reads each operand tensor as if it were contiguous from its first byte (a kernel that
    is handed a pointer and assumes the row pitch is the row length)."""

    def gemm(self, a, b, **kw):
        def flat(t):
            return torch.as_strided(t, t.shape, torch.empty(t.shape).stride()) if t.ndim else t

        def fix(q):
            return dataclasses.replace(q, **{f.name: flat(getattr(q, f.name)) for f in dataclasses.fields(q)
                                              if isinstance(getattr(q, f.name), torch.Tensor)})
        return super().gemm(fix(a), fix(b), **kw)


class _LeavesScalePaddingUnwritten(EmulatedBackend):
    """Quantizes into torch.empty scale storage and writes only the blocks that hold data
    (TE PR#3070: padded scale bytes never written)."""

    def quantize(self, x, spec):
        q = super().quantize(x, spec)
        if not hasattr(q, "scales") or q.codes.shape[-1] == q.shape[-1]:
            return q
        scales = torch.full_like(q.scales, 0xFF)  # what an unwritten, poisoned allocation holds
        live = -(-q.shape[-1] // q.block_size)
        scales[..., :live] = q.scales[..., :live]
        return dataclasses.replace(q, scales=scales)


def test_poison_padding_fails_a_gemm_that_ignores_operand_strides(gen):
    with pytest.raises(NumericsError):
        CHECKS["poison_padding"](_IgnoresStrides(), RECIPES["mxfp8"], gen)


def test_poison_padding_fails_a_quantizer_that_leaves_the_k_padding_unwritten(gen):
    with pytest.raises(NumericsError, match="scales"):
        CHECKS["poison_padding"](_LeavesScalePaddingUnwritten(), RECIPES["mxfp4"], gen)


def test_poison_guard_tiles_fails_a_blob_gemm_that_reads_a_guard_tile(gen):
    class ReadsGuard(EmulatedBackend):
        def gemm_mxfp6_blob(self, a_blob, b_blob, a_sblob, b_sblob, m, n, k):
            nk = -(-k // 128) + MXFP6_GUARD_K_TILES
            guard = a_sblob.view(-1, nk, 1024)[:, -1].float()  # a byte of the last guard tile
            return torch.zeros(m, n, dtype=torch.bfloat16) + guard[0, 0].to(torch.bfloat16)

    with pytest.raises(NumericsError):
        CHECKS["poison_guard_tiles"](ReadsGuard(), RECIPES["mxfp6"], gen)


def test_guard_poison_leaves_the_data_bytes_alone():
    codes = torch.randint(0, 64, (40, 96), dtype=torch.uint8)
    scales = torch.randint(100, 140, (40, 3), dtype=torch.uint8)
    blob, sblob = _guard_poisoned(codes, scales)
    clean, sclean = pack_mxfp6_blob(codes, scales)
    assert (blob.numel(), sblob.numel()) == mxfp6_blob_sizes(40, 96)
    changed = blob != clean
    assert changed.any() and bool((blob[changed] == 0xFF).all())
    assert bool((sblob != sclean).any())


def test_poison_output_fails_a_gemm_that_accumulates_into_uninitialised_memory(gen):
    class EmptyAccumulator(EmulatedBackend):
        def gemm(self, a, b, **kw):
            out = super().gemm(a, b, **kw)
            acc = torch.empty(128, 128, dtype=out.dtype, device=out.device)  # 64 KiB, as a tile
            acc[: out.shape[0], : out.shape[1]] += out
            return acc[: out.shape[0], : out.shape[1]].clone()

    with pytest.raises(NumericsError):
        CHECKS["poison_output"](EmptyAccumulator(), RECIPES["mxfp8"], gen)
