"""Claims as data: recipe files, the claim resolver, what a backend is judged on, and how
its declarations (supports, Refusal, available) become outcomes that never read as green."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mxcheck import backends
from mxcheck.backends.emulated import EmulatedBackend
from mxcheck.conformance import DEFAULT_RECIPES
from mxcheck.conformance.claims import claims_of
from mxcheck.recipe_files import load_recipe_file, resolve_recipe
from mxcheck.recipes import OCP_MX_RECIPES, OPERANDS, OperandSpec, get_recipe

pytestmark = pytest.mark.emulated

HERE = Path(__file__).parent / "test_claims"


# ---- the OCP MX v1.0 recipes ------------------------------------------------------------

@pytest.mark.parametrize(("name", "fmt"), [("ocp-mxfp4", "e2m1"), ("ocp-mxfp6-e2m3", "e2m3"),
                                           ("ocp-mxfp6-e3m2", "e3m2"), ("ocp-mxfp8-e4m3", "e4m3"),
                                           ("ocp-mxfp8-e5m2", "e5m2")])
def test_ocp_recipes_are_floor_rne_saturating_1x32_blocks_without_rotation_on_all_six_copies(name, fmt):
    # OCP MX v1.0 section 6.3; mx_quantize saturates (DESIGN.md), so no field says it.
    expected = OperandSpec(fmt=fmt, scaling="mx", block_size=32, block_2d=False, scale_rule="floor",
                           rounding="rne", hadamard=None, zero_scale=0, pad_to=None)
    recipe = get_recipe(name)
    assert [recipe.spec(op) for op in OPERANDS] == [expected] * 6
    assert name in DEFAULT_RECIPES


# ---- recipe files -------------------------------------------------------------------------

def test_a_yaml_recipe_file_gives_its_six_specs():
    r = load_recipe_file(HERE / "my_mxfp8.yaml")
    one_d = OperandSpec("e4m3", "mx", scale_rule="floor")
    assert r.name == "my-mxfp8" and r.out_dtype == torch.bfloat16
    assert [r.spec(op) for op in OPERANDS] == [one_d, replace(one_d, block_2d=True), one_d,
                                               replace(one_d, block_2d=True), one_d, one_d]


def test_a_toml_recipe_file_reads_as_the_yaml_one(tmp_path):
    path = tmp_path / "my_mxfp8.toml"
    path.write_text('name = "my-mxfp8"\n[all]\nfmt = "e4m3"\nscaling = "mx"\nscale_rule = "floor"\n'
                    '[w_row]\nblock_2d = true\n[w_col]\nblock_2d = true\n')
    if sys.version_info < (3, 11):
        with pytest.raises(ValueError, match=r"TOML needs Python >= 3\.11"):
            load_recipe_file(path)
        return
    assert replace(load_recipe_file(path), source="") == replace(load_recipe_file(HERE / "my_mxfp8.yaml"), source="")


@pytest.mark.parametrize(("text", "match"), [
    ("name: r\nall: {fmt: e4m3, scaling: mx, scale_rul: floor}\n",
     r"key 'all.scale_rul' is not known; did you mean 'scale_rule'\?"),
    ("name: r\nx_rows: {fmt: e4m3}\n", r"key 'x_rows' is not known; did you mean 'x_row'\?"),
    ("name: r\nall: {fmt: e4m3, scaling: mx, block_size: '32'}\n", r"key 'all.block_size' = '32'; expected int"),
    ("name: r\nall: {fmt: e4m3, scaling: mx, block_2d: 1}\n", r"key 'all.block_2d' = 1; expected bool"),
    ("name: r\nall: {fmt: e4m3, scaling: mx, scale_rule: round}\n", r"operand x_row .*scale_rule='round'; expected one of"),
    ("name: r\nall: {fmt: e4m3, scaling: mxfp}\n", r"operand x_row .*scaling='mxfp'"),
    ("all: {fmt: e4m3}\n", r"key 'name' is required"),
    ("name: r\nout_dtype: half\n", r"key 'out_dtype' = 'half'; expected one of \['bfloat16', 'float16', 'float32'\]"),
    ("name: r\nshape_multiple: 0\n", r"key 'shape_multiple' = 0; expected a positive integer"),
    ("name: r\nall: [e4m3]\n", r"key 'all' must be a table of OperandSpec fields, got list"),
    ("- just a list\n", r"expected a table of keys"),
    ("name: [unclosed\n", r"not valid YAML"),
], ids=["misspelt-field", "misspelt-operand", "str-for-int", "int-for-bool", "bad-rule", "bad-scaling",
        "no-name", "bad-out-dtype", "bad-multiple", "operand-not-a-table", "not-a-table", "not-yaml"])
def test_a_bad_recipe_file_names_the_file_the_key_and_what_is_accepted(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        load_recipe_file(path)
    assert str(path) in str(e.value)


def test_resolve_recipe_takes_names_files_and_recipes_and_suggests_a_near_name():
    assert resolve_recipe("ocp-mxfp8-e4m3") is OCP_MX_RECIPES["ocp-mxfp8-e4m3"]
    assert resolve_recipe(str(HERE / "my_mxfp8.yaml")).name == "my-mxfp8"
    assert resolve_recipe(OCP_MX_RECIPES["ocp-mxfp4"]) is OCP_MX_RECIPES["ocp-mxfp4"]
    with pytest.raises(ValueError, match=r"recipe='ocp_mxfp8_e4m3' is not known; did you mean 'ocp-mxfp8-e4m3'\?"):
        resolve_recipe("ocp_mxfp8_e4m3")
    with pytest.raises(ValueError, match="no such file"):
        resolve_recipe(str(HERE / "absent.yaml"))


# ---- what a backend is judged on -----------------------------------------------------------

@pytest.fixture
def under_test(monkeypatch: pytest.MonkeyPatch):
    """The module tests/test_claims/backends_under_test.py, importable as backends_under_test."""
    monkeypatch.syspath_prepend(str(HERE))
    import backends_under_test

    return backends_under_test


def test_claims_come_from_the_command_line_else_the_backend_else_every_builtin_recipe(under_test):
    ClaimsOcp = under_test.ClaimsOcp

    assert [(c.recipe.name, c.by) for c in claims_of(ClaimsOcp())] == [
        ("ocp-mxfp4", "backend"), ("ocp-mxfp8-e5m2", "backend")]
    cli = [get_recipe("mxfp8")]
    assert [(c.recipe.name, c.by) for c in claims_of(ClaimsOcp(), cli)] == [("mxfp8", "command line")]
    default = claims_of(EmulatedBackend())
    assert [c.recipe.name for c in default] == list(DEFAULT_RECIPES)
    assert not any(c.declared for c in default)


@pytest.mark.parametrize(("claims", "error", "match"), [
    ([], ValueError, "claims is empty"),
    ("ocp-mxfp4", TypeError, "expected a list of recipe names"),
    (["ocp-mxfp4", "mxfp9"], ValueError, r"backend 'emulated' claims 'mxfp9': recipe='mxfp9' is not known; did you mean"),
], ids=["empty", "a-bare-string", "unknown-name"])
def test_a_bad_claim_names_the_backend_and_the_claim(claims, error, match):
    backend = EmulatedBackend()
    backend.claims = claims
    with pytest.raises(error, match=match):
        claims_of(backend)


# ---- loading a backend ----------------------------------------------------------------------

def test_a_misspelt_backend_or_factory_gets_the_nearest_name(under_test):
    with pytest.raises(backends.BackendLoadError, match=r"did you mean 'emulated'\?"):
        backends.get("emulatd")
    with pytest.raises(backends.BackendLoadError, match=r"has no attribute 'Refuse'; did you mean 'Refuses'\?"):
        backends.get("backends_under_test:Refuse")


def test_a_module_that_does_not_import_names_the_path_it_searched():
    with pytest.raises(backends.BackendLoadError, match=r"cannot import 'no_such_kernels.mx' .*put the directory that "
                                                        r"holds 'no_such_kernels' on PYTHONPATH .*searched sys.path: "):
        backends.get("no_such_kernels.mx:make")


def test_vendor_output_at_import_is_one_line_per_package_when_collapsed(tmp_path, monkeypatch, capfd):
    (tmp_path / "noisy_vendor_pkg.py").write_text(
        "import sys, warnings\nprint('probing ROCm... none', file=sys.stderr)\n"
        "print('Failed to load _C.so', file=sys.stderr)\nwarnings.warn('old API')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_REPORTED", set())
    backends.collapse_import_output(True)
    try:
        assert backends.import_vendor("noisy_vendor_pkg") is None
    finally:
        backends.collapse_import_output(False)
        sys.modules.pop("noisy_vendor_pkg", None)
    err = capfd.readouterr().err.splitlines()
    assert err == ["mxcheck: noisy_vendor_pkg printed 3 line(s) while importing (first: 'probing ROCm... none'); "
                   "-v shows them"]


def test_an_absent_vendor_package_is_a_missing_dependency():
    why = backends.import_vendor("no_such_vendor_pkg.sub")
    assert isinstance(why, backends.MissingDependency)
    assert (why.package, why.found) == ("no_such_vendor_pkg", None)


def test_version_problem_names_what_is_needed_and_what_was_found(monkeypatch):
    from mxcheck.backends import contract

    monkeypatch.setattr(contract.metadata, "version", lambda name: {"vendorlib": "0.13.2+cu126"}[name])
    assert contract.version_problem("vendorlib", "0.13") is None
    old = contract.version_problem("vendorlib", "0.14", below="0.19")
    assert str(old) == "needs vendorlib>=0.14,<0.19 (found 0.13.2+cu126)"
    assert (old.package, old.needed, old.found) == ("vendorlib", ">=0.14,<0.19", "0.13.2+cu126")
    assert str(contract.version_problem("vendorlib", below="0.13.2")) == "needs vendorlib<0.13.2 (found 0.13.2+cu126)"


# ---- outcomes in a run ----------------------------------------------------------------------

@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run the installed conformance suite's quantize checks on a backend of backends_under_test."""
    from mxcheck.deps import REQUIRE_DEPS_ENV

    monkeypatch.delenv(REQUIRE_DEPS_ENV, raising=False)
    shutil.copy(HERE / "backends_under_test.py", pytester.path / "backends_under_test.py")
    pytester.syspathinsert()

    def run(backend: str, *args: str, only: str = "") -> pytest.RunResult:
        return pytester.runpytest("--pyargs", "mxcheck.conformance.suite", "-p", "no:cacheprovider", "-ra",
                                  "--mxcheck-backend", f"backends_under_test:{backend}",
                                  "-k", f"test_backend_conforms and quantize and not poison{only}", *args)
    return run


def test_a_value_error_inside_quantize_on_an_accepted_recipe_fails_the_run(suite):
    result = suite("RaisesValueError", "--mxcheck-recipe", "ocp-mxfp8-e4m3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ValueError: my_quant: unexpected layout*"])


def test_a_refusal_is_counted_as_refused_not_passed(suite):
    result = suite("Refuses", "--mxcheck-recipe", "ocp-mxfp8-e4m3")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["1 tests skipped: 1 refused (declared)",
                                 "*quantize: backend refuses refused: my_quant takes K multiples of 1024, got K=512*"])


def test_a_claim_the_backend_then_does_not_support_fails(suite):
    result = suite("DisownsItsClaim")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*backend disowns-its-claim claims recipe ocp-mxfp8-e4m3 (named by the backend) "
                                 "but its supports() says no: no MX kernels in this build*"])


def test_unsupported_default_recipes_are_counted_as_not_supported(suite):
    result = suite("SupportsNothing", only=" and ocp-mxfp4")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["1 tests skipped: 1 not supported by the backend"])


@pytest.mark.parametrize("strict", [False, True], ids=["skips", "require-deps-fails"])
def test_a_backend_whose_dependency_is_too_old_says_which_version_it_needs(suite, strict):
    result = suite("TooOld", "--mxcheck-recipe", "ocp-mxfp4", *(["--mxcheck-require-deps"] if strict else []))
    result.assert_outcomes(**({"failed": 1} if strict else {"skipped": 1}))
    result.stdout.fnmatch_lines(["*needs mykernels>=2.0 (found 1.3)*"])
    if not strict:
        result.stdout.fnmatch_lines(["1 tests skipped: 1 not runnable here"])


def test_a_misspelt_recipe_option_is_a_usage_error_with_the_nearest_name(suite):
    result = suite("Refuses", "--mxcheck-recipe", "ocp-mxfp8-e4m")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mxcheck-recipe ocp-mxfp8-e4m: recipe='ocp-mxfp8-e4m' is not known; "
                                 "did you mean 'ocp-mxfp8-e4m3'?*"])


@pytest.mark.parametrize(("factory", "code"), [("SupportsNothing", 1), ("ClaimsOcp", 0)],
                         ids=["nothing-judged", "judged"])
def test_mxcheck_conform_exits_1_when_nothing_was_judged(under_test, capsys, factory, code):
    from mxcheck.cli import main

    # in-process (the subprocess path from outside a checkout: tests/test_docs_example.py)
    got = main(["conform", "--backend", f"backends_under_test:{factory}", "--",
                "-k", "test_backend_conforms and quantize and not poison and ocp-mxfp4"])
    out = capsys.readouterr().out
    assert got == code, out
    assert ("nothing was judged" in out) == (code == 1), out


# ---- FILE@PROFILE -------------------------------------------------------------------------

def test_a_recipe_file_takes_a_profile_as_a_recipe_name_does(tmp_path):
    path = tmp_path / "my_nvfp4.yaml"
    path.write_text("name: my-nvfp4\nall: {fmt: e2m1, scaling: nvfp4, block_size: 16}\n")
    pinned = resolve_recipe(f"{path}@modelopt.nvfp4")
    # the file's recipe pinned the way NAME@PROFILE pins a built-in one
    assert pinned == load_recipe_file(path).with_profile("modelopt.nvfp4")
    assert pinned.name == "my-nvfp4@modelopt.nvfp4"
    assert {pinned.spec(op).profile for op in OPERANDS} == {"modelopt.nvfp4"}
    assert replace(pinned, name="x", source="") == replace(get_recipe("nvfp4-1x16@modelopt.nvfp4"), name="x",
                                                             source="", notes=())
    # a profile under `all:` in the file pins the same copies the same way
    inline = tmp_path / "inline.yaml"
    inline.write_text("name: my-nvfp4\nall: {fmt: e2m1, scaling: nvfp4, block_size: 16, profile: modelopt.nvfp4}\n")
    assert [load_recipe_file(inline).spec(op) for op in OPERANDS] == [pinned.spec(op) for op in OPERANDS]
    with pytest.raises(ValueError, match=r"'modelopt\.nvfp' is not a known profile; did you mean 'modelopt\.nvfp4'"):
        resolve_recipe(f"{path}@modelopt.nvfp")
    with pytest.raises(ValueError, match="no such file"):
        resolve_recipe(f"{tmp_path / 'absent.yaml'}@modelopt.nvfp4")
    with pytest.raises(ValueError, match=r"has no operand of scaling 'nvfp4'"):
        resolve_recipe(f"{HERE / 'my_mxfp8.yaml'}@te.nvfp4")


def test_a_backend_may_claim_a_recipe_file_pinned_to_a_profile(tmp_path):
    path = tmp_path / "plain_mxfp8.yaml"
    path.write_text("name: plain-mxfp8\nall: {fmt: e4m3, scaling: mx}\n")
    claims = claims_of(type("B", (), {"name": "b", "claims": [f"{path}@torchao.floor"]})())
    assert [(c.recipe.name, c.recipe.x_row.profile, c.by) for c in claims] == \
        [("plain-mxfp8@torchao.floor", "torchao.floor", "backend")]
