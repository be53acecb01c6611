"""Edge shapes (Flux img_in K=64, final layer N=64, modulation M=batch, K%256, K%32, M%16/32/128):
every backend and recipe computes correctly or raises a clear error naming the dim."""

from __future__ import annotations

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends import Refusal
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import EDGE_SHAPES, edge_shape_outcome
from mxcheck.flux import flux_linear_shapes, unique_gemms
from mxcheck.functions import quant_linear
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import RECIPES, get_recipe
from mxcheck.report import Report
from mxcheck.report.markdown import render_markdown
from mxcheck.report.outcomes import counts_text, outcome_of
from mxcheck.report.recorder import Numerics
from tests.conformance.test_values import OracleValues

pytestmark = pytest.mark.emulated


def test_flux_edges_are_in_the_flux_table():
    gemms = unique_gemms(flux_linear_shapes("flux-12b", 2, 256, 256, replaced_only=False))
    fwd = {(m, n, k) for (d, m, n, k) in gemms if d == "fwd"}
    assert any(k == 64 for _, _, k in fwd)  # img_in
    assert any(n == 64 for _, n, _ in fwd)  # final_layer.linear
    assert any(m == 2 for m, _, _ in fwd)  # modulation at batch 2
    assert any(d == "wgrad" and k == 2 for (d, _, _, k) in gemms)  # wgrad contracts over the batch


def test_the_k_mod_256_garbage_backend_is_caught_only_off_256():
    bad = KNOWN_BAD["bad-k-mod-256"]()
    with pytest.raises(NumericsError, match="fp32-accumulation bound"):
        edge_shape_outcome(bad, RECIPES["mxfp4"], "K384-Kmod256", torch.Generator().manual_seed(0))
    assert edge_shape_outcome(EmulatedBackend(), RECIPES["mxfp4"], "K384-Kmod256",
                              torch.Generator().manual_seed(0)) == {"quantize": "correct", "gemm": "correct",
                                                                     "linear": "correct"}


class _GemmRaises:
    """A GEMM-only backend whose gemm raises ``error`` (its linear is the reference Function on it)."""

    name = "raises"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def gemm(self, a, b, **kw):
        raise self.error


@pytest.mark.parametrize(("error", "verdict"), [
    (Refusal("gemm: K=96 is not a multiple of 256"), "refused"),
    (Refusal("rows must be a multiple of 16, got 13"), "refused"),
    (RuntimeError("CUDA error: an illegal memory access"), "raised RuntimeError, not mxcheck.backends.Refusal"),
    (ValueError("gemm: M=13 is not a multiple of 16"), "raised ValueError, not mxcheck.backends.Refusal"),
    (NotImplementedError("M=13 is not a multiple of 16"), "raised NotImplementedError, not mxcheck.backends.Refusal"),
    # refused at every shape, the regular one too: about the spec, so declared without a dim
    (Refusal("unsupported recipe"), "refused"),
], ids=["names-K", "names-value", "runtime-error", "undeclared-value-error", "undeclared-not-implemented",
        "refused-everywhere"])
def test_only_a_refusal_naming_the_dim_or_made_at_every_shape_is_a_refusal(error, verdict):
    backend, gen = _GemmRaises(error), torch.Generator().manual_seed(0)
    if verdict == "refused":
        outcome = edge_shape_outcome(backend, RECIPES["fp8"], "M13", gen)
        assert {v.split(" (also at")[0] for v in outcome.values()} == {f"refused: {error}"}, outcome
    else:
        with pytest.raises(NumericsError, match=verdict):
            edge_shape_outcome(backend, RECIPES["fp8"], "M13", gen)


class _GemmRefusesUnder256:
    """A GEMM-only backend that refuses any M under 256 without saying which dim."""

    name = "gemm-refuses-small"

    def gemm(self, a, b, **kw):
        if a.codes.shape[0] < 256:
            raise Refusal("unsupported shape")
        return EmulatedBackend().gemm(a, b, **kw)


def test_a_refusal_of_the_edge_shape_alone_must_name_the_dim():
    with pytest.raises(NumericsError, match=r"raised Refusal without naming M, N or K .*about the shape\): "
                                            "unsupported shape"):
        edge_shape_outcome(_GemmRefusesUnder256(), RECIPES["fp8"], "M13", torch.Generator().manual_seed(0))


class _QuantizesOnly1D:
    """Quantizes 1D blocks only (AITER's e2m1 quantizer): a 2D-block spec is refused at any
    shape, with a message about the spec that names no dim."""

    name = "quantizes-1d-only"

    def quantize(self, x, spec, *, state=None):
        if spec.block_2d:
            raise Refusal(f"quantizes 1x32 MX blocks; spec has block_2d={spec.block_2d}")
        return quantize_operand(x, spec)


def test_a_refusal_about_the_spec_is_declared_at_an_edge_shape():
    records: list = []
    numerics = Numerics(records.append, "test_edges", backend="quantizes-1d-only")
    outcome = edge_shape_outcome(_QuantizesOnly1D(), RECIPES["mxfp4"], "M13", torch.Generator().manual_seed(0),
                                 numerics)
    assert outcome["quantize"] == ("refused: quantizes 1x32 MX blocks; spec has block_2d=True "
                                   "(also at M=N=K=256: about the spec, not the shape)"), outcome
    [q] = [r for r in records if r.layer == "edge M13: quantize"]
    assert outcome_of(q) == "refused"


def test_the_reference_functions_own_refusal_is_not_applicable_not_the_backends():
    # A values backend's linear is the reference Function on its values; the shapes that
    # Function cannot take (wgrad contracting M=2 under 32-blocks) are mxcheck's, not declared.
    class DeclaredOracleValues(OracleValues):
        def fake_quantize(self, x, spec, *, state=None):
            try:
                return super().fake_quantize(x, spec, state=state)
            except ValueError as e:  # a shape the block does not divide: declared, naming the dim
                raise Refusal(str(e)) from None

    records: list = []
    numerics = Numerics(records.append, "test_edges", backend="oracle-values")
    for shape in EDGE_SHAPES:
        edge_shape_outcome(DeclaredOracleValues(), RECIPES["mxfp8"], shape, torch.Generator().manual_seed(0),
                           numerics)
    outcomes = [outcome_of(r) for r in records if r.kind == "edge_shape" and r.layer.endswith(": linear")]
    assert "refused" not in outcomes and outcomes.count("not_applicable") > 0, outcomes
    assert "refused (declared)" not in counts_text([r for r in records if r.layer.endswith(": linear")])


class _GemmRefusesShortK:
    """A GEMM-only backend (as the Triton adapter) that refuses a contraction under 128."""

    name = "gemm-refuses-short-k"

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def gemm(self, a, b, **kw):
        if a.codes.shape[-1] < 128:
            raise self.error(f"K of a ({a.codes.shape[-1]}) must be a multiple of 128")
        return EmulatedBackend().gemm(a, b, **kw)


@pytest.mark.parametrize(("error", "verdict"), [(Refusal, "refused"), (ValueError, "raised ValueError")])
def test_a_refusal_from_a_gemm_in_the_backward_reaches_the_check_as_it_was_raised(error, verdict):
    # final_layer-N64 (M=32, N=64, K=256): the forward contracts 256, dgrad contracts N=64 in
    # the backward, after the reference Function's forward returned (the H200 Triton adapter).
    backend, gen = _GemmRefusesShortK(error), torch.Generator().manual_seed(0)
    if verdict == "refused":
        outcome = edge_shape_outcome(backend, RECIPES["mxfp8"], "final_layer-N64", gen)
        assert outcome["linear"] == "refused: K of a (64) must be a multiple of 128", outcome
    else:
        with pytest.raises(NumericsError, match=verdict):
            edge_shape_outcome(backend, RECIPES["mxfp8"], "final_layer-N64", gen)


class _Bf16Inputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.bfloat16().float()

    @staticmethod
    def backward(ctx, g):
        return g


class _Bf16Linear:
    """The reference Function on bf16 copies of x, W and b, as TE's adapter hands te.Linear
    its inputs (mxcheck/backends/transformer_engine.py::_Bridge.forward)."""

    name = "bf16-linear"

    def linear(self, x, weight, bias, recipe, states=None):
        return quant_linear(_Bf16Inputs.apply(x), _Bf16Inputs.apply(weight), _Bf16Inputs.apply(bias), recipe,
                            states=states)


@pytest.mark.parametrize("name", ["K384-Kmod256", "modulation-M64"])
@pytest.mark.parametrize("recipe", ["fp8", "fp8-hybrid", "fp8-delayed", "nvfp4", "mxfp8"])
def test_a_linear_that_rounds_its_inputs_to_bf16_sees_the_same_inputs(recipe, name):
    # TE 2.20 on the H200 was 32.6-39.2 dB from the reference Function in dgrad at these edges
    # with bit-identical dY codes (tools/h200/te_edge_dgrad_probe.py): the edge inputs held
    # float32 values (amax tiles scaled by a full-mantissa amax) that TE rounds to bf16.
    outcome = edge_shape_outcome(_Bf16Linear(), get_recipe(recipe), name, torch.Generator().manual_seed(0))
    assert outcome["linear"] == "correct", outcome


def test_every_edge_shape_leaves_one_record_passed_refused_with_its_reason_or_failed(tmp_path):
    records: list = []
    numerics = Numerics(records.append, "test_edges", backend="gemm-refuses-short-k")
    backend, gen = _GemmRefusesShortK(Refusal), torch.Generator().manual_seed(0)
    for shape in EDGE_SHAPES:
        edge_shape_outcome(backend, RECIPES["fp8"], shape, gen, numerics)
    path = tmp_path / "report.json"
    Report(records=records).save(path)
    shape_records = [r for r in Report.load(path).records if r.kind == "edge_shape"]
    assert sorted(r.layer for r in shape_records) == sorted(f"edge {s}: {p}" for s in EDGE_SHAPES
                                                            for p in ("gemm", "linear"))
    for r in shape_records:
        shape, path_name = r.layer.removeprefix("edge ").split(": ")
        if path_name == "gemm" and EDGE_SHAPES[shape][2] < 128:
            assert (outcome_of(r), r.message) == ("refused", f"refused: K of a ({EDGE_SHAPES[shape][2]}) must be "
                                                              "a multiple of 128"), r
        elif path_name == "gemm":
            assert (outcome_of(r), r.passed, r.message) == ("passed", True, "correct"), r
        else:  # the linear's three GEMMs contract K, N and M: refused where any is under 128
            refused = min(EDGE_SHAPES[shape][:3]) < 128
            assert outcome_of(r) == ("refused" if refused else "passed"), r
            assert r.message.startswith("refused: K of a (") if refused else r.message == "correct", r
    n_refused = sum(outcome_of(r) == "refused" for r in shape_records)
    assert n_refused > 0 and f"{n_refused} refused (declared)" in counts_text(records)
    assert f"{n_refused} refused (declared)" in render_markdown(Report(records=records))


def test_a_failing_edge_shape_leaves_a_failed_record_and_still_fails():
    records: list = []
    numerics = Numerics(records.append, "test_edges", backend="bad-k-mod-256")
    with pytest.raises(NumericsError):
        edge_shape_outcome(KNOWN_BAD["bad-k-mod-256"](), RECIPES["mxfp4"], "K384-Kmod256",
                           torch.Generator().manual_seed(0), numerics)
    [gemm] = [r for r in records if r.kind == "edge_shape" and r.layer == "edge K384-Kmod256: gemm"]
    assert (outcome_of(gemm), gemm.passed) == ("failed", False)
    assert gemm.message.startswith("gemm of recipe mxfp4 at M=32 N=64 K=384")


class _QuantizeOnly:
    """The oracle's quantize and nothing else. ``bug``: "one-row" zeroes the codes of a
    one-row operand (M = 1); "value-error" raises a plain ValueError where the block does
    not divide K (not a declared Refusal)."""

    name = "quantize-only"

    def __init__(self, bug: str = "") -> None:
        self.bug, self.shapes = bug, []

    def available(self):
        return True, ""

    def supports(self, recipe):
        return True, ""

    def quantize(self, x, spec, *, state=None):
        from dataclasses import replace as _replace

        from mxcheck.gemm import quantize_operand

        self.shapes.append(tuple(x.shape))
        if self.bug == "value-error" and x.shape[-1] % spec.block_size:
            raise ValueError("shape mismatch in kernel launch")
        try:
            q = quantize_operand(x, spec)
        except ValueError as e:  # a shape the oracle cannot take: declared, naming the dim
            raise Refusal(str(e)) from None
        return _replace(q, codes=torch.zeros_like(q.codes)) if self.bug == "one-row" and x.shape[0] == 1 else q


def test_a_quantize_only_backend_is_quantized_at_every_edge_shape():
    from mxcheck.conformance.edges import EDGE_SHAPES, check_edge_shapes

    backend = _QuantizeOnly()
    assert check_edge_shapes(backend, get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0)) is None
    # x_row [M, K] and w_row [N, K] at each shape: odd K, K off the block, M of 1 included
    assert backend.shapes == [s for m, n, k, _ in EDGE_SHAPES.values() for s in ((m, k), (n, k))]
    assert (1, 256) in backend.shapes and (32, 40) in backend.shapes


@pytest.mark.parametrize(("bug", "failing", "message"), [
    ("one-row", "modulation-M1", "quantize of recipe nvfp4-1x16 at M=1 N=128 K=256"),
    ("value-error", "K40-Kmod16", "quantize of x_row, recipe nvfp4-1x16, at {'M': 32, 'N': 64, 'K': 40} raised "
                                  "ValueError, not mxcheck.backends.Refusal")])
def test_a_quantize_only_backend_that_fails_an_edge_shape_fails_there_only(bug, failing, message):
    from mxcheck.conformance.edges import check_edge_shapes

    with pytest.raises(NumericsError) as e:
        check_edge_shapes(_QuantizeOnly(bug), get_recipe("nvfp4-1x16"), torch.Generator().manual_seed(0))
    lines = str(e.value).splitlines()
    assert lines[0].startswith("edge shapes of recipe nvfp4-1x16: quantize fails at 1 of 12 shapes"), lines[0]
    assert lines[1].startswith(f"quantize at {failing} ") and message in lines[1], lines[1]
