"""The precision manifest: what each linear actually ran, and failing closed when it differs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mxcheck.backends.known_bad import Bf16Fallback
from mxcheck.flux import (
    Flux,
    break_zero_init,
    init_weights,
    make_inputs,
    quantize_model,
    quantized_linears,
)
from mxcheck.manifest import PrecisionError, trace_precision
from mxcheck.report import Report

pytestmark = pytest.mark.emulated


def _model(recipe="mxfp4", backend="emulated"):
    gen = torch.Generator().manual_seed(0)
    model = init_weights(Flux("flux-tiny"), generator=gen)
    break_zero_init(model, generator=gen)
    model = model.bfloat16()
    quantize_model(model, recipe, backend)
    return model


def _run(model, backward=True):
    inputs = make_inputs("flux-tiny", 2, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16)
    with trace_precision(model) as m:
        out = model(**inputs)
        if backward:
            out.float().square().mean().backward()
    return m, out


def _fall_back(model, name):
    """Put a plain bf16 nn.Linear (same parameters) where a quantized linear was: what an
    import error that turns MXFP4 into BF16 does (Primus PR #1010)."""
    q = quantized_linears(model)[name]
    plain = nn.Linear(q.in_features, q.out_features, dtype=torch.bfloat16)
    plain.weight, plain.bias = q.weight, q.bias
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, plain)


def test_every_layer_and_direction_recorded_and_check_passes():
    m, _ = _run(_model("mxfp4"))
    m.check("mxfp4")
    summary = m.summary()
    for layer in quantized_linears(_model("mxfp4")):
        assert set(summary[layer]) == {"fwd", "dgrad", "wgrad"}, layer
        assert summary[layer]["wgrad"] == ["mxcheck::quantize g_col e2m1 mx even",
                                           "mxcheck::quantize x_col e2m1 mx even", "mxcheck::gemm e2m1"]
    # bf16 modulation linears are recorded as what they are
    assert summary["double_blocks.0.img_mod.lin"]["fwd"] == ["aten::addmm bfloat16 none"]
    assert not m.unattributed


def test_silent_bf16_fallback_in_one_layer_is_an_error_naming_it():
    model = _model("mxfp4")
    _fall_back(model, "single_blocks.0.linear2")
    m, _ = _run(model)
    with pytest.raises(PrecisionError) as e:
        m.check("mxfp4")
    text = str(e.value)
    assert "3 precision problem" in text
    for direction in ("fwd", "dgrad", "wgrad"):
        assert f"single_blocks.0.linear2 {direction}: GEMM aten::" in text
    assert "ran in bfloat16 where the recipe says" in text
    assert "double_blocks" not in text  # only the fallen-back layer


def test_other_format_or_scale_rule_is_an_error_naming_the_operand():
    m, _ = _run(_model("mxfp4"))
    with pytest.raises(PrecisionError, match=r"x_row quantized as fmt=e2m1 scaling=mx scale_rule=even.*"
                                             r"says fmt=e4m3 scaling=mx scale_rule=rceil"):
        m.check("mxfp8")


def test_a_backend_that_runs_bf16_fails_the_check():
    m, _ = _run(_model("mxfp8", backend=Bf16Fallback()), backward=False)
    with pytest.raises(PrecisionError, match=r"fwd: GEMM aten::(add)?mm ran in bfloat16"):
        m.check("mxfp8")


def test_forward_only_trace_checks_fwd_and_a_layer_that_never_ran_is_an_error():
    m, _ = _run(_model("fp8"), backward=False)
    assert not m.backward_seen
    m.check("fp8")
    with pytest.raises(PrecisionError, match="dgrad: no GEMM recorded"):
        m.check("fp8", directions=("fwd", "dgrad"))
    with pytest.raises(ValueError, match=r"\['bwd'\] not among"):
        m.check("fp8", directions=("bwd",))
    with pytest.raises(TypeError, match="include="):
        m.check("fp8", include="double_blocks.*")


def test_tracing_changes_no_numerics():
    model = _model("nvfp4")  # SR gradients: the tracer must not draw random numbers either
    inputs = make_inputs("flux-tiny", 2, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16)
    results = []
    for traced in (False, True):
        model.zero_grad()
        torch.manual_seed(5)
        if traced:
            with trace_precision(model):
                out = model(**inputs)
                out.float().square().mean().backward()
        else:
            out = model(**inputs)
            out.float().square().mean().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


# A vendor GEMM, as a dispatched op with AITER's name: recognised by name, format e2m1.
@torch.library.custom_op("fakeaiter::gemm_a4w4", mutates_args=())
def _fake_gemm_a4w4(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return a.float() @ w.float().T


@_fake_gemm_a4w4.register_fake
def _(a, w):
    return a.new_empty(a.shape[0], w.shape[0], dtype=torch.float32)


class _VendorLinear(nn.Linear):
    def forward(self, x):
        return _fake_gemm_a4w4(x.reshape(-1, self.in_features), self.weight).reshape(*x.shape[:-1], -1)


def test_vendor_op_is_recognised_and_attributed():
    model = nn.Sequential()
    model.add_module("proj", _VendorLinear(64, 32))
    with trace_precision(model) as m:
        model(torch.randn(4, 64))
    assert m.summary() == {"proj": {"fwd": ["fakeaiter::gemm_a4w4 e2m1 mx"]}}
    m.check("mxfp4", include=("proj",))
    with pytest.raises(PrecisionError, match=r"fakeaiter::gemm_a4w4 ran e2m1; recipe mxfp8 says \['e4m3'\]"):
        m.check("mxfp8", include=("proj",))


# The ops as the vendors dispatch them (vendor_audit.md): AITER's gemm_a6w6 is Python around
# aiter::_gemm_a6w6_asm; Primus-Turbo's FP6 and accumulate GEMMs are primus_turbo:: ops.
@torch.library.custom_op("fakevendor::_gemm_a6w6_asm", mutates_args=())
def _fake_a6w6(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return a.float() @ w.float().T


@torch.library.custom_op("fakevendor::gemm_fp4_accum_impl", mutates_args=())
def _fake_fp4_accum(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return a.view(torch.uint8).float() @ w.view(torch.uint8).float().T


class _OpLinear(nn.Linear):
    def __init__(self, op, k, n):
        super().__init__(k, n)
        self.op = op

    def forward(self, x):
        return self.op(x, self.weight)


@pytest.mark.parametrize(("op", "dtype", "want"), [
    (_fake_a6w6, torch.float32, "fakevendor::_gemm_a6w6_asm fp6 mx"),
    (_fake_fp4_accum, torch.float4_e2m1fn_x2, "fakevendor::gemm_fp4_accum_impl e2m1 mx"),
], ids=["aiter-a6w6-asm", "primus-fp4-accum"])
def test_dispatched_vendor_op_names_are_recognised(op, dtype, want):
    model = nn.Sequential()
    model.add_module("proj", _OpLinear(op, 64, 32))
    if dtype != torch.float32:
        model.proj.weight = nn.Parameter(torch.zeros(32, 64, dtype=torch.uint8).view(dtype), requires_grad=False)
    x = torch.zeros(4, 64, dtype=torch.uint8).view(dtype) if dtype != torch.float32 else torch.randn(4, 64)
    with trace_precision(model) as m:
        model(x)
    assert m.summary() == {"proj": {"fwd": [want]}}


@torch.library.custom_op("fakevendor::fp4_scaled_mm", mutates_args=())
def _fake_fp4_vendor_op(a: torch.Tensor) -> torch.Tensor:
    return a.view(torch.uint8).float()


def test_fp4_operand_dtype_reads_as_e2m1_not_the_torch_dtype_name(monkeypatch):
    import mxcheck.manifest as manifest

    monkeypatch.setitem(manifest.VENDOR_OPS, "fp4_scaled_mm", ("gemm", None, "mx"))  # format from the dtype
    model = nn.Sequential()
    model.add_module("proj", _OpLinear(lambda x, w: _fake_fp4_vendor_op(x), 64, 32))
    with trace_precision(model) as m:
        model(torch.zeros(4, 32, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    assert m.summary() == {"proj": {"fwd": ["fakevendor::fp4_scaled_mm e2m1 mx"]}}


class _UntracedLinear(nn.Linear):
    """What the TE adapter does: run opaque kernels, announce each direction as UNTRACED."""

    def forward(self, x):
        from mxcheck.backends.transformer_engine import _Bridge  # noqa: F401  (the adapter's import)
        from mxcheck.trace_ops import UNTRACED, announce_gemm

        announce_gemm(x, "", "fwd", UNTRACED, UNTRACED, "transformer_engine")
        return super().forward(x)


def test_untraceable_backend_is_reported_as_not_proven_not_as_no_gemm():
    model = nn.Sequential()
    model.add_module("proj", _UntracedLinear(64, 32))
    with trace_precision(model) as m:
        model(torch.randn(4, 64))
    with pytest.raises(PrecisionError, match=r"proj fwd: ran in transformer_engine, whose quantize and GEMM calls "
                                             r"are pybind11 functions a dispatch trace cannot see") as e:
        m.check("fp8", include=("proj",))
    assert "no GEMM recorded" not in str(e.value)


def test_manifest_goes_into_the_report(tmp_path):
    m, _ = _run(_model("mxfp8"), backward=False)
    report = Report.from_json({"version": 1, "records": [], "precision_manifest": m.to_json()})
    report.save(tmp_path / "r.json")
    back = Report.load(tmp_path / "r.json").to_json()["precision_manifest"]
    assert back["layers"]["double_blocks.0.img_attn.qkv"]["fwd"] == m.summary()["double_blocks.0.img_attn.qkv"]["fwd"]
    with pytest.raises(PrecisionError, match="matches no linear"):
        m.check("mxfp8", include=("nothing",))


def test_numerics_precision_records_the_manifest_and_fails_closed():
    from mxcheck.assertions import NumericsError
    from mxcheck.report.recorder import Numerics

    records = []
    numerics = Numerics(records.append, "t", recipe="mxfp4")
    model = _model("mxfp4")
    _fall_back(model, "double_blocks.0.img_mlp.2")
    m, _ = _run(model, backward=False)
    with pytest.raises(NumericsError, match=r"double_blocks\.0\.img_mlp\.2 fwd: GEMM aten::"):
        numerics.precision(m, "mxfp4")
    (record,) = records
    assert (record.kind, record.passed) == ("precision", False)
    layers = record.extra["precision_manifest"]["layers"]
    assert layers["double_blocks.0.img_mlp.2"]["fwd"] == ["aten::addmm bfloat16 none"]
    assert layers["double_blocks.0.img_mlp.0"]["fwd"][-1] == "mxcheck::gemm e2m1"
    numerics.precision(m, "mxfp4", include=("double_blocks.0.img_mlp.0",))
    assert records[-1].passed


def test_announcements_reach_a_profiler_and_are_skipped_when_nothing_listens():
    # The announcements are dispatched only where something could read them (a dispatch
    # mode, as trace_precision above; a profiler; a compiler): a plain step skips them.
    from torch.utils._python_dispatch import TorchDispatchMode

    from mxcheck.trace_ops import _listened

    model = _model("mxfp8")
    inputs = make_inputs("flux-tiny", 2, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(**inputs)
    assert {"mxcheck::quantize", "mxcheck::gemm"} <= {e.key for e in prof.key_averages()}

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(2)
    assert not _listened(x)
    with Passthrough():
        assert _listened(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert _listened(x)
    assert not _listened(torch.nn.Parameter(x))

    class Subclass(torch.Tensor):
        pass

    assert _listened(x.as_subclass(Subclass))  # a subclass's own dispatch may read them
    assert not _listened(x)
