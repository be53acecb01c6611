"""The fit (mxcheck.diagnose.fit): the profile that reproduces a kernel, every convention
combined, and honest headlines in a quantize failure."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from mxcheck.assertions import NumericsError
from mxcheck.backends.contract import Refusal
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.backends.known_bad import KNOWN_BAD
from mxcheck.conformance import CHECKS
from mxcheck.conformance.fitting import fit_backend, fit_cases
from mxcheck.diagnose.fit import Fit, FitCase, fit, profile_fields
from mxcheck.profiles import ALL_PROFILES, AnyProfile
from mxcheck.recipes import RECIPES, Recipe

pytestmark = pytest.mark.emulated

_RECIPE_OF = {("mx", "e2m1"): "mxfp4", ("mx", "e2m3"): "mxfp6", ("mx", "e4m3"): "mxfp8", ("mx", None): "mxfp8",
              ("nvfp4", "e2m1"): "nvfp4", ("tensor", None): "fp8"}


class ProfileBackend(EmulatedBackend):
    """Quantizes every operand as one profile does."""

    def __init__(self, profile: AnyProfile) -> None:
        self.profile = profile
        self.name = f"profile-{profile.name}"

    def quantize(self, x, spec, **kw):
        return self.profile.quantized(x, spec.fmt)


def _declaring(p: AnyProfile) -> Recipe:
    """A recipe of p's kind whose x_row declares the spec fields p repeats (its rule,
    rounding, rotation), as Recipe.with_profile does, but not the profile itself."""
    r = RECIPES[_RECIPE_OF.get((p.scaling, p.fmt)) or _RECIPE_OF[(p.scaling, None)]]
    return replace(r, x_row=replace(r.x_row, **{f: getattr(p, f) for f in p.spec_fields}))


# Fields the fit sets otherwise than declared that the inputs tell apart only together: each
# alone is a one-binade (or Inf byte) change, both together the declared bits. aiter.mxfp6
# rotates before scaling (no block amax lands a float32 ulp below 2^k, so a float32 log2
# reads the exponent bits) and a log2 of Inf clamps to byte 254, the declared Inf byte.
TOGETHER = {"aiter.mxfp6": ("exponent_source", "inf_amax_byte")}


def _recovers(p: AnyProfile) -> None:
    """The fit of p's own quantizer is p: residual 0, no more conventions than p declares,
    and every field where the fitted profile differs from the declared one is one the inputs
    cannot tell apart (p with that field at the fitted value gives the same bits on every
    comparison; for TOGETHER, those fields at once)."""
    recipe = _declaring(p)
    (found,) = fit_backend(ProfileBackend(p), recipe, operands=("x_row",))
    f = found.fit
    assert f is not None and f.residual == 0, (p.name, f and f.text())
    got, want = profile_fields(replace(f.profile(), fmt=p.fmt)), profile_fields(p)  # a fit from a spec is a family
    declared = {n for n, v in profile_fields(f.base).items() if want[n] != v}
    assert len(f.fields) <= len(declared) + len(TOGETHER.get(p.name, ())), (p.name, f.text(), declared)
    cases = fit_cases(ProfileBackend(p), recipe, torch.Generator().manual_seed(0), operands=("x_row",))
    differ = [n for n in want if got[n] != want[n]]
    groups = [differ] if set(differ) == set(TOGETHER.get(p.name, ())) else [[n] for n in differ]
    for group in groups:
        twin = replace(p, **{n: got[n] for n in group})
        for case in next(iter(cases.values())):
            q = twin.quantized(case.x, case.spec.fmt)
            for field in ("codes", "scales", "block_scales", "tensor_scale", "scale_inv"):
                if isinstance(getattr(q, field, None), torch.Tensor):
                    a, b = getattr(q, field), getattr(case.kernel, field)
                    assert torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(a.isnan(), b.isnan())
                                                 and torch.equal(a.nan_to_num(0), b.nan_to_num(0))), \
                        (p.name, group, case.label, field)


FAST = ("microxcaling", "torchao0.5.float8")  # two conventions each, MX and FP8; the rest run as slow


@pytest.mark.parametrize("name", FAST)
def test_fit_recovers_a_profile_from_its_own_quantizer(name):
    _recovers(ALL_PROFILES[name])


def test_fit_combines_three_conventions_at_once():
    """The even rule, -0 lost and the Inf byte 254 on an rceil recipe (a released QAT
    library's MX, issue 36): the fit names all three, residual 0; pairs could not."""
    (found,) = fit_backend(KNOWN_BAD["bad-three-conventions"](), RECIPES["mxfp8"], operands=("x_row",),
                           inputs=("bf16", "inf-nan"))
    fields = found.fit.fields
    assert fields == {"scale_rule": "even", "zero_sign": "never", "inf_amax_byte": 254}, found.fit.text()
    assert found.fit.residual == 0


def test_fit_names_nvfp4_scale_arithmetic_in_bf16():
    """Not in KNOWN_BAD (the quantize check's NVFP4 inputs keep a bf16-exact tensor scale):
    on Gaussian rows with an odd amax the fit names bf16 scale arithmetic."""
    from mxcheck.backends.known_bad import NVFP4Bf16Scales
    from mxcheck.gemm import quantize_operand

    spec = RECIPES["nvfp4"].x_row
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)) * 3.1
    f = fit([FitCase(x, spec, quantize_operand(x, spec), NVFP4Bf16Scales().quantize(x, spec))])
    assert f.fields == {"scale_dtype": "bfloat16"} and f.residual == 0, f.text()


def _failure(backend, recipe: Recipe) -> str:
    with pytest.raises(NumericsError) as info:
        CHECKS["quantize"](backend, recipe, torch.Generator().manual_seed(0))
    return str(info.value)


def _even(recipe: Recipe) -> Recipe:
    return replace(recipe, name=f"{recipe.name}-even", x_row=replace(recipe.x_row, scale_rule="even"),
                   w_row=replace(recipe.w_row, scale_rule="even"))


def test_the_even_rule_at_the_wrong_mantissa_width_is_headlined_by_its_width_not_rceil():
    """Issue 36: an even rule at e2m1's width on MXFP8 was headlined "rceil" (a weaker fit
    that changes blocks the kernel gets right). Only an exact fit may head the summary and
    each comparison's text; rceil may appear only as a weaker fit."""
    message = _failure(KNOWN_BAD["bad-even-mantissa"](), _even(RECIPES["mxfp8"]))
    cause = message.split("\ncause:\n", 1)[1].splitlines()
    assert cause[0].lstrip().startswith(tuple(f"{n} of the {n} differing blocks examined are reproduced by: even "
                                              "scale rule at 1-bit mantissa" for n in re.findall(r"([\d,]+) of the",
                                                                                                cause[0])[:1])), \
        message[:3000]
    heads = [line for line in message.splitlines() if re.match(r"\s*[\d,]+ of [\d,]+ differing blocks are reproduced by", line)]
    assert heads and not any("rceil" in line for line in heads), heads
    assert all("1-bit mantissa" in line for line in heads), heads
    rceil = [line for line in message.splitlines() if "rceil scale rule" in line]
    assert rceil and all("weaker fits, not a cause" in line for line in rceil), rceil


class _NaNPayloads(EmulatedBackend):
    """The oracle's NVFP4 bits, but a NaN tensor_scale with another payload (0x7fffffff
    against 0x7fc00000) and codes 0x7 under every NaN block scale."""

    name = "nan-payloads"

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        ts = q.tensor_scale
        if bool(torch.isnan(ts).any()):
            ts = torch.where(torch.isnan(ts), torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32), ts)
        nan = ((q.block_scales & 0x7F) == 0x7F).repeat_interleave(16, dim=-1)
        return replace(q, tensor_scale=ts, codes=torch.where(nan, 7, q.codes).to(torch.uint8))


def test_nan_payloads_and_codes_under_a_nan_block_scale_are_not_compared():
    backend = _NaNPayloads()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=gen)
    x[3, 5] = float("nan")
    q = backend.quantize(x, RECIPES["nvfp4"].x_row)
    assert q.tensor_scale.view(torch.int32) == 0x7FFFFFFF and bool((q.codes == 7).all())  # the premise
    assert CHECKS["quantize"](backend, RECIPES["nvfp4"], torch.Generator().manual_seed(0)) is None


def test_a_fit_is_none_where_profiles_cannot_model_the_spec():
    spec = RECIPES["mxfp4"].w_row  # 2D tiles
    x = torch.randn(64, 64)
    from mxcheck.gemm import quantize_operand

    q = quantize_operand(x, spec)
    assert fit([FitCase(x, spec, q, q)]) is None
    assert isinstance(fit([FitCase(x, RECIPES["mxfp8"].x_row, quantize_operand(x, RECIPES["mxfp8"].x_row),
                                   quantize_operand(x, RECIPES["mxfp8"].x_row))]), Fit)


def test_a_weaker_fit_never_heads_the_text_even_when_nothing_fits_exactly():
    from mxcheck.diagnose import CATALOGUE, Attribution, render_attributions

    rceil = CATALOGUE["mx.scale_rule=rceil"]
    lines = render_attributions([Attribution(rceil, 12_884, 13_625, "blocks", also_changes=57)], 13_625, 741)
    assert not any(" are reproduced by: " in line for line in lines), lines
    assert lines[0].startswith("no known behaviour reproduces any of the 13,625 differing blocks"), lines
    assert "weaker fits, not a cause" in lines[1] and rceil.title in lines[1], lines


def test_fit_cli_writes_a_recipe_file_that_pins_the_fitted_profile(tmp_path, capsys):
    """mxcheck fit --write: the file states the fitted profile inline; the quantize check
    on that recipe then passes the backend the recipe it claims failed."""
    from mxcheck.cli.main import main
    from mxcheck.recipe_files import load_recipe_file

    backend = "mxcheck.backends.known_bad:EvenRuleAtE2M1Width"
    path = tmp_path / "fitted.yaml"
    assert main(["fit", "--backend", backend, "--recipe", "mxfp8", "--write", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "mxfp8 x_row+w_row = profile(scale_mbits=1, scale_rule='even') + residual 0 blocks" in printed, printed
    recipe = load_recipe_file(path)
    assert recipe.x_row.profile == "mxfp8.x_row+w_row.fitted" and recipe.x_row.scale_rule == "even"
    # mxfp8's other copies have x_row's spec: the same quantizer, pinned the same (torchao
    # refuses a recipe that quantizes x_row and x_col differently)
    for op in ("x_col", "w_col", "g_row", "g_col"):
        assert recipe.spec(op) == recipe.x_row, op
    gen = torch.Generator().manual_seed(0)
    assert CHECKS["quantize"](KNOWN_BAD["bad-even-mantissa"](), recipe, gen) is None


def test_an_inline_profile_in_a_recipe_file_is_checked_key_by_key(tmp_path):
    from mxcheck.recipe_files import load_recipe_file

    path = tmp_path / "r.yaml"
    path.write_text("name: r\nall: {fmt: e4m3, scaling: mx}\n"
                    "x_row: {profile: {kind: mx, name: r.x, scale_rule: even, inf_amax_bite: 254}}\n")
    with pytest.raises(ValueError, match=r"key 'x_row.profile.inf_amax_bite' is not known.*inf_amax_byte"):
        load_recipe_file(path)
    path.write_text("name: r\nall: {fmt: e4m3, scaling: mx}\n"
                    "x_row: {profile: {kind: mx, name: r.x2, scale_rule: even, inf_amax_byte: 254, zero_sign: never}}\n")
    recipe = load_recipe_file(path)
    assert (recipe.x_row.profile, recipe.x_row.scale_rule) == ("r.x2", "even")
    from mxcheck.profiles import get_profile

    p = get_profile("r.x2")
    assert (p.inf_amax_byte, p.zero_sign, p.fmt) == (254, "never", None)


def test_dump_writes_every_differing_block_of_every_comparison(tmp_path, monkeypatch):
    """--mxcheck-dump: every failing comparison in one .pt, every differing block in it
    (the report shows a few in full), loaded with one call."""
    from mxcheck.diagnose import load_dump
    from mxcheck.diagnose.dump import DUMP_ENV

    monkeypatch.setenv(DUMP_ENV, str(tmp_path))
    message = _failure(KNOWN_BAD["bad-inf-block-127"](), RECIPES["mxfp8"])
    records = load_dump(tmp_path)
    counts = [int(n.replace(",", "")) for n in re.findall(r"^\S+ \(.+?\): ([\d,]+) of [\d,]+ blocks differ", message,
                                                           flags=re.M)]
    assert len(records) == len(counts) == int(re.search(r": (\d+) of \d+ comparisons differ", message)[1])
    assert sorted(len(r["blocks"]) for r in records) == sorted(counts)
    for r in records:
        per_row = r["blocks_per_row"]
        for block in r["blocks"].tolist():
            row = int((r["rows"] == block // per_row).nonzero())
            assert int(r["kernel"]["scales"][row, block % per_row]) == 127
            assert bool(torch.isinf(r["input"][row, (block % per_row) * 32:(block % per_row + 1) * 32]).any())
        n = len(r["blocks"])
        assert r["attribution"][0].startswith(f"{n} of {n} differing blocks are reproduced by: a block holding an "
                                              "Inf stores scale byte 127"), r["attribution"]


def test_conform_passes_dump_to_pytest(tmp_path):
    from mxcheck.cli.conform import pytest_args
    from mxcheck.cli.main import build_parser

    args = build_parser().parse_args(["conform", "--backend", "emulated", "--dump", str(tmp_path / "d")])
    got = pytest_args(args, str(tmp_path / "r.json"))
    assert got[got.index("--mxcheck-dump") + 1] == str((tmp_path / "d").resolve())


def test_poison_padding_counts_and_shows_blocks_as_the_quantize_check_does():
    from tests.conformance.test_poison import _LeavesScalePaddingUnwritten

    with pytest.raises(NumericsError) as info:
        CHECKS["poison_padding"](_LeavesScalePaddingUnwritten(), RECIPES["mxfp4"], torch.Generator().manual_seed(0))
    message = str(info.value)
    found = re.search(r"x_row\.scales \(poisoned allocator\): (\d+) of (\d+) blocks differ", message)
    assert found and 0 < int(found[1]) < int(found[2]), message
    assert re.search(r"scales: kernel 0xff \(NaN\) \| oracle 0x[0-9a-f]{2} \(2\^-?\d+\)", message), message
    assert f"{found[1]} of {found[1]} differing blocks are reproduced by no known behaviour" in message, message


class _OnMetaOnly(EmulatedBackend):
    """A kernel that reads only tensors on its device, as a Triton kernel reads no CPU pointer
    ("meta" stands for "cuda" on a CPU runner): it raises on any other device and records
    where each input was. Knowing no data, it returns the oracle's quantization of zeros."""

    name = "on-meta-only"
    device = "meta"

    def __init__(self):
        self.seen = []

    def quantize(self, x, spec, **kw):
        self.seen.append(x.device.type)
        if x.device.type != "meta":
            raise RuntimeError(f"Pointer argument (at 0) cannot be accessed from Triton ({x.device.type} tensor?)")
        return super().quantize(torch.zeros(x.shape, dtype=x.dtype), spec, **kw)


def test_fit_runs_the_backend_on_its_device_and_the_oracle_on_the_cpu():
    backend = _OnMetaOnly()
    recipe = RECIPES["mxfp8"]
    cases = fit_cases(backend, recipe, torch.Generator().manual_seed(0), rows=32, cols=64, operands=("x_row",),
                      inputs=("zeros",))
    (group,) = cases.values()
    assert backend.seen and set(backend.seen) == {"meta"}, backend.seen
    for case in group:  # the oracle quantized the real (CPU) input; the kernel's result came back
        assert case.oracle.codes.device.type == case.kernel.codes.device.type == "cpu"
        from mxcheck.gemm import quantize_operand

        assert torch.equal(case.oracle.scales, quantize_operand(case.x, case.spec).scales), case.label
    (found,) = fit_backend(_OnMetaOnly(), recipe, rows=32, cols=64, operands=("x_row",), inputs=("zeros",))
    assert found.fit is not None and not found.refused


class _RefusesTiles(EmulatedBackend):
    """Quantizes 1D blocks as the oracle and refuses 2D tiles (as AITER's quantizer does)."""

    name = "refuses-tiles"

    def quantize(self, x, spec, **kw):
        if spec.block_2d:
            raise Refusal("this quantizer quantizes 1x32 blocks only; the spec has block_2d=True")
        return super().quantize(x, spec, **kw)


class _RefusesEverything(EmulatedBackend):
    name = "refuses-everything"

    def quantize(self, x, spec, **kw):
        raise Refusal("no quantizer for this spec here")


def test_a_refusal_inside_the_fit_is_a_declared_skip_of_that_spec():
    fits = fit_backend(_RefusesTiles(), RECIPES["mxfp4"], rows=32, cols=64, inputs=("zeros",))
    by_operand = {f.operands: f for f in fits}
    assert by_operand[("w_row",)].refused.startswith("w_row, zeros")
    assert "block_2d=True" in by_operand[("w_row",)].refused and by_operand[("w_row",)].fit is None
    assert not by_operand[("x_row",)].refused


def test_the_fit_cli_prints_a_refusal_as_a_declared_skip_not_a_crash(capsys):
    from tests._helpers import run_cli

    code, out, err = run_cli(capsys, "fit", "--backend", "tests.test_fit:_RefusesEverything", "--recipe", "mxfp8")
    assert code == 1 and not err, err
    assert "mxfp8 x_row+w_row: refused by the backend (declared), not fitted: x_row, " in out, out
    assert "no quantizer for this spec here" in out and "nothing was fitted" in out, out


class EvenRuleValues:
    """A fake-quant kernel (values only): the even scale rule at e2m1's 1-bit mantissa on every
    MX operand (``bad-even-mantissa``), returned as float32 values."""

    name = "even-rule-values"

    def __init__(self):
        self.codes = KNOWN_BAD["bad-even-mantissa"]()

    def available(self):
        return True, ""

    def supports(self, recipe):
        return True, ""

    def fake_quantize(self, x, spec, **kw):
        return self.codes.quantize(x, spec, **kw).dequantize()


def test_fit_on_a_values_backend_names_the_even_rule_with_residual_0():
    (found,) = fit_backend(EvenRuleValues(), RECIPES["mxfp8"], operands=("x_row",),
                           inputs=("bf16", "amax"))
    assert found.fit.fields == {"scale_rule": "even", "scale_mbits": 1}, found.fit.text()
    assert found.fit.residual == 0 and found.fit.differing > 0, found.fit.text()


def _zero_sign_cases():
    """Comparisons of a kernel whose only convention is every zero code +0 (the zero code's
    sign), on inputs with no Inf and no amax a float32 ulp under a power of two."""
    from mxcheck.diagnose.catalogue import spec_profile

    recipe = RECIPES["mxfp8"]
    base = spec_profile(recipe.x_row, torch.zeros(1, 32))
    backend = ProfileBackend(replace(base, name="zero-sign-never", zero_sign="never"))
    (cases,) = fit_cases(backend, recipe, torch.Generator().manual_seed(0), operands=("x_row",),
                         inputs=("bf16", "neg-zero")).values()
    return base, cases


def _conventions(*pairs):
    from mxcheck.diagnose.catalogue import CONVENTIONS
    from mxcheck.profiles import Profile

    return tuple(next(c for c in CONVENTIONS if c.kind is Profile and (c.field, c.value) == p) for p in pairs)


def test_the_fit_names_one_convention_where_it_explains_every_block_not_a_combination():
    """Issue 42: a fit that starts from another comparison's three conventions (a float32
    log2, the Inf byte 255, the zero code's sign) on blocks that only the zero code's sign
    tells apart names that one convention: each other member changes nothing here."""
    base, cases = _zero_sign_cases()
    three = _conventions(("exponent_source", "log2_fp32"), ("inf_amax_byte", 255), ("zero_sign", "never"))
    start = Fit(base, three, (), 0, 0, 0, 0, 0)
    f = fit(cases, start)
    assert f.residual == 0 and f.differing > 0, f.text()
    assert f.fields == {"zero_sign": "never"} and f.size == 1, f.text()
