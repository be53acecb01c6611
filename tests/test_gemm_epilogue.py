"""The fused epilogue of the outer-scaled GEMM (``mx_cuda.outer_scaled_epilogue``: FP8 tensor-
and row-scaled operands, NVFP4 operands) gives the torch epilogue's bits: the float32 sum
times ``outer_a * outer_b``, plus the bias, each rounded apart, then one cast.

The outputs are compared bit for bit with ``MXCHECK_FUSED_MX=0`` (torch's passes) on the same
quantized operands. A float32 output with a bias is where an FMA contraction of the multiply
and the add would show (it rounds once where the torch path rounds twice); a bf16 or fp16
output checks the final cast, overflow to Inf included. On CUDA (``-m cuda``) every case runs;
in Triton's interpreter on a CPU (``emulated``) a subset.
"""

from __future__ import annotations

import pytest
import torch

from mxcheck.gemm import emulated_gemm, quantize_operand
from mxcheck.recipes import OperandSpec
from mxcheck.scaling import mx_cuda
from tests.test_mx_fused import interpreted  # noqa: F401  (the fixture the interpreter tests use)

M, N, K = 48, 40, 64
OPERANDS = {
    "fp8 tensor": (OperandSpec("e4m3", "tensor"), OperandSpec("e4m3", "tensor")),
    "fp8 row": (OperandSpec("e4m3", "row"), OperandSpec("e5m2", "row")),
    "fp8 tensor x row": (OperandSpec("e5m2", "tensor"), OperandSpec("e4m3", "row")),
    "nvfp4": (OperandSpec("e2m1", "nvfp4", block_size=16), OperandSpec("e2m1", "nvfp4", block_size=16)),
}
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BIASES = (None, torch.bfloat16, torch.float32)


def operands(kind: str, device: str, gen: torch.Generator, spread: float = 1.0):
    """a (M, K) and b (N, K) quantized as ``kind``, their rows spread over 2**+-8 (row scales
    that differ) times ``spread``, and a bias (N,)."""
    rows = lambda r: torch.randn(r, K, generator=gen) * 2.0 ** torch.randint(-8, 9, (r, 1), generator=gen)  # noqa: E731
    x, w = rows(M) * spread, rows(N)
    spec_a, spec_b = OPERANDS[kind]
    a, b = (quantize_operand(t.to(device), s) for t, s in ((x, spec_a), (w, spec_b)))
    return a, b, torch.randn(N, generator=gen) * 64


def both_epilogues(a, b, bias, out_dtype, monkeypatch):
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    want = emulated_gemm(a, b, out_dtype=out_dtype, bias=bias)
    monkeypatch.setenv("MXCHECK_FUSED_MX", "1")
    return emulated_gemm(a, b, out_dtype=out_dtype, bias=bias), want


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, what
    ints = {2: torch.int16, 4: torch.int32}[got.element_size()]
    bad = (got.cpu().view(ints) != want.cpu().view(ints)).nonzero()
    assert not len(bad), (f"{what}: {len(bad)} of {got.numel()} outputs differ; first at {bad[0].tolist()}: "
                          f"{got[tuple(bad[0])].item()!r} vs {want[tuple(bad[0])].item()!r}")


@pytest.mark.cuda
@pytest.mark.parametrize("bias_dtype", BIASES, ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", OPERANDS)
def test_fused_epilogue_equals_the_torch_epilogue(kind, out_dtype, bias_dtype, gen, monkeypatch):
    pytest.importorskip("triton")
    # spread 2**10: some bf16 and fp16 outputs overflow to Inf, the cast's other edge
    for spread in (1.0, 2.0**10):
        a, b, bias = operands(kind, "cuda", gen, spread)
        bias = None if bias_dtype is None else bias.to("cuda", bias_dtype)
        got, want = both_epilogues(a, b, bias, out_dtype, monkeypatch)
        assert_bits_equal(got, want, f"{kind}, spread {spread}")


@pytest.mark.cuda
def test_fused_epilogue_runs_on_cuda_and_can_be_switched_off(monkeypatch):
    """The kernel is taken (so the test above compares two paths) and the switch turns it off."""
    pytest.importorskip("triton")
    acc, one = torch.ones(4, 8, device="cuda"), torch.ones((), device="cuda")
    assert mx_cuda.outer_scaled_epilogue(acc, one, one, None, torch.bfloat16) is not None
    monkeypatch.setenv("MXCHECK_FUSED_MX", "0")
    assert mx_cuda.outer_scaled_epilogue(acc, one, one, None, torch.bfloat16) is None


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
@pytest.mark.parametrize("bias_dtype", BIASES, ids=str)
@pytest.mark.parametrize("kind", ["fp8 row", "nvfp4"])
def test_fused_epilogue_in_the_interpreter_equals_the_torch_epilogue(kind, bias_dtype, gen, monkeypatch):
    # float32 outputs: the interpreter rounds float32 to bf16 its own way (the cuda test
    # takes every output dtype)
    a, b, bias = operands(kind, "cpu", gen)
    bias = None if bias_dtype is None else bias.to(bias_dtype)
    got, want = both_epilogues(a, b, bias, torch.float32, monkeypatch)
    assert_bits_equal(got, want, kind)


@pytest.mark.emulated
@pytest.mark.usefixtures("interpreted")
def test_fused_epilogue_refuses_outer_scales_that_do_not_fit():
    acc = torch.ones(4, 8)
    with pytest.raises(ValueError, match="do not fit an output of shape"):
        mx_cuda.outer_scaled_epilogue(acc, torch.ones(3, 1), torch.ones(()), None, torch.float32)
