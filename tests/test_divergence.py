"""divergence(): where two profiles give different bits on the battery; DIVERGENCE_TABLE:
each case of reference_emulators.md (RE) section 8, and the tests it names exist; the
pinned cases that live here; the ``mxcheck divergence`` command."""

from __future__ import annotations

import ast
import functools
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from mxcheck import divergence as div
from mxcheck.cli import build_parser
from mxcheck.formats import encode, get_format
from mxcheck.plugin import needs
from mxcheck.profiles import PROFILES, Profile, get_profile
from mxcheck.scaling.blocks import block_amax
from mxcheck.scaling.mx import mx_quantize
from tests._helpers import one_block, run_cli, torchao_to_mx
from tests._witness import Witnesses

with needs("ml_dtypes"):
    import ml_dtypes

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).parents[1]
E2M1 = get_format("e2m1")


# ------------------------------------------------------------------ Primus-Turbo even vs OCP floor


def even_bump_crosses_a_binade(amax: torch.Tensor) -> torch.Tensor:
    """primus_stack.md 1.2: the even rule doubles the scale when amax's significand is
    >= 1.75 (both top mantissa bits set), unless the clamp at byte 0 hides it; worked from
    the float32 fields, not with the rule under test."""
    bits = amax.view(torch.int32)
    field, top2 = (bits >> 23) & 0xFF, (bits >> 21) & 0x3
    floor_byte = (field - 129).clamp(min=-127)
    even_byte = (field + 1 - 129).clamp(min=-127)
    return torch.isfinite(amax) & (amax > 0) & (top2 == 3) & (even_byte != floor_byte)


def test_primus_vs_ocp_scales_differ_exactly_where_the_even_bump_crosses_a_binade():
    primus, ocp = PROFILES["primus_turbo.mxfp4"], PROFILES["ocp"]
    # the planted case: amax 7.0 = 1.75 * 2^2 -> floor byte 127, even byte 128
    assert primus.quantize(one_block(7.0))[1].item() == 128 and ocp.quantize(one_block(7.0), E2M1)[1].item() == 127
    differing = 0
    for name, x in div.battery(E2M1).items():
        if name == "nan":  # NaN policy (ignore vs block), not the scale rule
            continue
        (cp, sp), (co, so) = primus.quantize(x, E2M1), ocp.quantize(x, E2M1)
        amax = block_amax(x, 1, 32)
        assert torch.equal(sp != so, even_bump_crosses_a_binade(amax)), name
        # codes differ only inside those blocks, and nowhere where amax is a power of two
        same_scale = (sp == so).repeat_interleave(32, dim=-1)
        assert torch.equal(cp[same_scale], co[same_scale]), name
        pow2 = (amax > 0) & ((amax.view(torch.int32) & 0x7FFFFF) == 0)
        assert not (sp != so)[pow2].any(), name
        differing += int((sp != so).sum())
    assert differing > 1000  # about one block in six of random data, all of amax_even_band


def test_report_counts_are_the_direct_counts():
    report = div.divergence("primus_turbo.mxfp4", "ocp")
    x = div.battery(E2M1)["normal"]
    (cp, sp), (co, so) = PROFILES["primus_turbo.mxfp4"].quantize(x), PROFILES["ocp"].quantize(x, E2M1)
    normal = report.classes[0]
    assert (normal.name, normal.blocks, normal.elements) == ("normal", 512, 16384)
    assert (normal.scale_diff, normal.code_diff) == (int((sp != so).sum()), int((cp != co).sum()))
    e = normal.examples[0]
    assert (e.scale_a, e.scale_b) == (sp[e.row, e.block].item(), so[e.row, e.block].item())
    assert {c.name for c in report.classes if c.scale_diff} >= {"normal", "amax_even_band", "nan"}
    assert next(c for c in report.classes if c.name == "amax_pow2").scale_diff == 0
    assert ("scale_rule", "even", "floor") in report.differences


@pytest.mark.parametrize("name", ["primus_turbo.mxfp4", "aiter.mxfp6.triton", "te.mxfp8", "torchao.rceil"])
def test_a_profile_never_diverges_from_itself(name):
    report = div.divergence(name, name, fmt=None if PROFILES[name].fmt else "e4m3")
    assert report.differences == ()
    assert all((c.scale_diff, c.code_diff, c.examples) == (0, 0, ()) for c in report.classes)


def test_battery_is_seeded_and_bad_arguments_raise():
    a, b = div.battery(E2M1, 1), div.battery(E2M1, 1)
    assert list(a) == list(div.INPUTS)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(a["normal"], div.battery(E2M1, 2)["normal"])
    with pytest.raises(ValueError, match="both families: pass fmt"):
        div.divergence("ocp", "torchao.floor")
    with pytest.raises(ValueError, match=r"pinned to e4m3 and primus_turbo\.mxfp4 to e2m1"):
        div.divergence("te.mxfp8", "primus_turbo.mxfp4")
    with pytest.raises(ValueError, match="inputs='all'"):
        div.divergence("ocp", "ocp", inputs="all", fmt="e2m1")


# ------------------------------------------------------------------ the table stays honest


def test_table_has_one_row_per_section_8_case_each_reached_or_explained():
    # rows 1-20 are section 8's cases; rows after them were found here
    assert [c.case for c in div.DIVERGENCE_TABLE] == list(range(1, 32))
    for c in div.DIVERGENCE_TABLE:
        assert c.options or c.tests or c.unreachable, c.case
        assert c.reached and c.title and c.libraries, c.case
        assert set(c.classes) <= set(div.INPUTS), c.case
        if not c.options:
            continue
        a, b = (get_profile(p) for p in c.profiles)
        assert type(a) is type(b) and (not c.classes or isinstance(a, Profile)), c.case  # the battery is MX
        quirks = {f.name for f in fields(a)}
        for option in c.options:
            field, _, values = option.partition("=")
            assert field in quirks, (c.case, option)
            if values:  # "field=v1|v2": exactly the two profiles' values
                assert {div._value(getattr(a, field)), div._value(getattr(b, field))} == set(values.split("|")), \
                    (c.case, option)
        # the named profiles really differ in one of the options
        assert any(getattr(a, o.partition("=")[0]) != getattr(b, o.partition("=")[0]) for o in c.options)


@functools.cache
def _test_functions(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))


def test_every_test_the_table_names_exists():
    named = [t for c in div.DIVERGENCE_TABLE for t in c.tests]
    assert len(named) >= 20
    for node in named:
        path, _, func = node.partition("::")
        assert "[" not in func, node  # a function, not one parametrization of it
        assert (ROOT / path).is_file(), node
        assert func in _test_functions(ROOT / path), node


def _cited() -> set[str]:
    return {t for c in div.DIVERGENCE_TABLE for t in c.tests}


# A test whose name says it pins a finding: test_pinned_*, or test_case<N>_* for case N.
_PINNED = re.compile(r"test_pinned_|test_case(\d+)_")


def test_every_pinned_test_has_a_table_row():
    # A pinned finding (a test named test_pinned_* or test_case<N>_*) without a row fails,
    # and a test_case<N>_ test is cited by row N.
    rows = {t: c.case for c in div.DIVERGENCE_TABLE for t in c.tests}
    pinned = [f"{path.relative_to(ROOT).as_posix()}::{name}" for path in sorted((ROOT / "tests").rglob("test_*.py"))
              for name in sorted(_test_functions(path)) if _PINNED.match(name)]
    assert len(pinned) >= 16
    assert [node for node in pinned if node not in rows] == []
    for node in pinned:
        m = _PINNED.match(node.partition("::")[2])
        assert m[1] is None or rows[node] == int(m[1]), node


# Tests docs/findings.md names in its "pinned by" column that pin no divergence between
# implementations' bits, so no row cites them: why.
NOT_DIVERGENCES = {
    "tests/conformance/test_edge_shapes.py::test_a_linear_that_rounds_its_inputs_to_bf16_sees_the_same_inputs":
        "a fix to mxcheck's own edge inputs",
    "tests/test_torch_backends.py::test_te_refuses_fp8_dims_cublaslt_cannot_take_naming_the_dim":
        "a refused configuration (cuBLASLt's leading-dim rule)",
    "tests/test_aiter_triton_backend.py::test_backend_gemm_is_within_the_fp32_accumulation_bound":
        "the GEMM passes; the finding is a shared-memory config for the H200",
    "tests/test_torchao_claims.py": "an adapter that skipped every torchao test on releases before 0.18 (fixed)",
    "tests/test_aiter_triton_backend.py": "the adapter's loading and launch config; the bf16 output is seen in the "
                                          "sweep, not pinned by a test",
}


def _findings_pinned_by() -> list[str]:
    """Every tests/... file or node the last column of docs/findings.md's table names."""
    out = []
    for line in (ROOT / "docs" / "findings.md").read_text(encoding="utf-8").splitlines():
        cells = re.split(r"(?<!\\)\|", line)
        if line.startswith("| ") and len(cells) > 3 and not set(cells[-2].strip()) <= {"-"}:
            out += re.findall(r"tests/[\w/]+\.py(?:::\w+)?", cells[-2])
    return out


def test_every_test_findings_md_pins_a_finding_with_has_a_table_row():
    # Each finding's "pinned by" test is cited by a row (a bare test file: some test of it is),
    # or is listed above as not a divergence of bits; every test_pinned_* one is cited.
    named = _findings_pinned_by()
    assert len(named) >= 10 and set(NOT_DIVERGENCES) <= set(named)
    cited = _cited()
    files = {t.partition("::")[0] for t in cited}
    for node in named:
        if node in NOT_DIVERGENCES:
            continue
        assert (node in cited) if "::" in node else (node in files), node
    assert [n for n in named if "::test_pinned_" in n and n not in cited] == []


@pytest.mark.parametrize("case", [c for c in div.DIVERGENCE_TABLE if c.classes], ids=lambda c: str(c.case))
def test_a_report_of_the_rows_profiles_names_the_row(case):
    a, b = case.profiles
    fmt = None if get_profile(a).fmt or get_profile(b).fmt else "e2m1"
    report = div.divergence(a, b, fmt=fmt)
    named = {c.name for c in report.classes if case.case in c.cases}
    assert named and named <= set(case.classes), (case.case, named)


def test_table_renders_as_text_and_json():
    text = div.table_text()
    notes = sum(len(c.versions) for c in div.DIVERGENCE_TABLE)
    assert text.count("\n") == 3 * len(div.DIVERGENCE_TABLE) + notes and " 3  FLOOR scale from a float32 log2" in text
    assert "\n    versions: ml_dtypes>=0.7 (0.7.0 run): they round to nearest, 0x00" in text
    rows = json.loads(json.dumps(div.table_json()))
    assert [r["case"] for r in rows] == list(range(1, 32)) and rows[2]["options"] == ["exponent_source"]
    assert rows[19]["reached"].startswith("pinned: tests/test_packing.py::")
    assert rows[20]["versions"][0].startswith("ml_dtypes<0.7 (0.6.0 run): casts float64 to float32 first")


def test_version_notes_name_a_witness_range_and_the_version_run():
    # Where a witness changed between versions the row says which versions behave how, as
    # tests/_witness.py pins them: "<witness><specifier> (<version> run): ..." or
    # "<witness> <version> ...", every version one that tests/_witness.py OBSERVED.
    from packaging.specifiers import SpecifierSet

    from tests._witness import OBSERVED
    pattern = re.compile(r"^(?P<w>[a-z_]+)(?:(?P<spec>[<>=!~][^ ]*) \((?P<run>[0-9.]+) run\)| (?P<v>[0-9.]+) )")
    noted = {c.case for c in div.DIVERGENCE_TABLE if c.versions}
    assert noted >= {14, 21}
    for c in div.DIVERGENCE_TABLE:
        for note in c.versions:
            m = pattern.match(note)
            assert m and m["w"] in OBSERVED, (c.case, note)
            version = m["run"] or m["v"]
            assert version in OBSERVED[m["w"]], (c.case, note)
            assert m["spec"] is None or version in SpecifierSet(m["spec"]), (c.case, note)


# ------------------------------------------------------------------ pinned cases of section 8


def test_case1_microxcaling_rounds_ties_away_where_ocp_rounds_to_even():
    # RE section 8 case 1, e2m1 at scale 1: 5 -> 6 (M) vs 4, 2.5 -> 3 vs 2, 0.25 -> 0.5 vs 0,
    # 1.25 -> 1.5 vs 1; e4m3: 400 -> 416 vs 384, 232 -> 240 vs 224. RNE side: ml_dtypes.
    x = one_block(6.0, 5.0, 2.5, 0.25, 1.25)
    assert PROFILES["microxcaling"].quantize(x, E2M1)[0][0, :5].tolist() == [0x7, 0x7, 0x5, 0x1, 0x3]
    ocp = PROFILES["ocp"].quantize(x, E2M1)[0][0, :5].tolist()
    assert ocp == [0x7, 0x6, 0x4, 0x0, 0x2]
    y = one_block(448.0, 400.0, 232.0)
    assert PROFILES["microxcaling"].quantize(y, "e4m3")[0][0, :3].tolist() == [0x7E, 0x7D, 0x77]
    assert PROFILES["ocp"].quantize(y, "e4m3")[0][0, :3].tolist() == [0x7E, 0x7C, 0x76]
    w = Witnesses()
    w.expect("ml_dtypes", x[0, :5].numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).tolist(),
             (0x7, 0x6, 0x4, 0x0, 0x2), "the e2m1 casts of 6, 5, 2.5, 0.25, 1.25")
    w.finish()


def test_case2_below_a_tie_rounds_to_zero_where_microxcaling_gives_min_subnormal():
    # RE section 8 case 2: microxcaling's float32 floor(|x| + 0.5) rounds 0.24999999 up to 0.5
    # (e2m1 0x1) and nextbelow(2^-10) up to 2^-9 (e4m3 0x01). Exact rounding (and ml_dtypes): 0.
    w = Witnesses()
    for fmt, v in (("e2m1", 0.25), ("e4m3", 2.0**-10)):
        x = torch.tensor([float(np.nextafter(np.float32(v), np.float32(0)))])
        assert encode(x, fmt).item() == 0x00
        ml = ml_dtypes.float4_e2m1fn if fmt == "e2m1" else ml_dtypes.float8_e4m3fn
        w.expect("ml_dtypes", x.numpy().astype(ml).view(np.uint8)[0], 0x00, f"the {fmt} cast of nextbelow({v})")
    # the microxcaling profile models it (half_away_sum="float32"): 0x1, as RE section 8 reads
    # microxcaling; e4m3 too (2^-10 is half of e4m3's smallest subnormal at scale 2^0)
    assert PROFILES["microxcaling"].quantize(one_block(6.0, 0.24999999), E2M1)[0][0, 1].item() == 0x1
    below = float(np.nextafter(np.float32(2.0**-10), np.float32(0)))
    assert PROFILES["microxcaling"].quantize(one_block(448.0, below), "e4m3")[0][0, 1].item() == 0x01
    w.finish()


def test_case8_even_rule_at_flt_max_carries_into_the_inf_field():
    # RE section 8 case 8 read torchao at a snapshot that returned 0xFF; torchao 0.18's EVEN
    # (witness) rounds FLT_MAX's bits to Inf's field: 255 - 127 - 8 = 120, byte 247, and
    # FLT_MAX / 2^120 = 255.99998 rounds to 256 (0x78). FLOOR: byte 246, 511.99997 saturates
    # to 448 (0x7E) -- torchao's _mxfp8_test_utils pins 246 / 0x7E.
    x = one_block(float(np.finfo(np.float32).max))
    even, floor = mx_quantize(x, "e4m3", scale_rule="even"), mx_quantize(x, "e4m3", scale_rule="floor")
    assert (even.scales.item(), even.codes[0, 0].item()) == (247, 0x78)
    assert (floor.scales.item(), floor.codes[0, 0].item()) == (246, 0x7E)
    scale, codes, _ = torchao_to_mx(x, "e4m3", "even")
    w = Witnesses()
    w.expect("torchao", (scale.item(), codes[0, 0].item()), (247, 0x78),
             "to_mx EVEN of a block with amax FLT_MAX (scale byte, code)")
    w.finish()


def test_case10_negative_zero_keeps_its_sign_as_ml_dtypes_and_torchao():
    # RE section 8 case 10: torchao, gfloat, ml_dtypes, torch, CUDA keep -0 (e2m1 0x8, e4m3
    # 0x80); TE's reference cast_to_fp4x2 and microxcaling give +0 (0x0).
    for name in ("ocp", "primus_turbo.mxfp4", "torchao.floor", "microxcaling"):
        assert get_profile(name).quantize(one_block(6.0, -0.0), E2M1)[0][0, 1].item() == 0x8, name
    assert PROFILES["te.mxfp8"].quantize(one_block(448.0, -0.0))[0][0, 1].item() == 0x80
    w = Witnesses()
    w.expect("ml_dtypes", np.array([-0.0], np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)[0], 0x8,
             "the e2m1 cast of -0.0")
    w.finish()


@pytest.mark.parametrize(("fmt", "top"), [("e2m1", 0x7), ("e2m3", 0x1F), ("e3m2", 0x1F)])
def test_case13_fp4_fp6_overflow_and_inf_saturate(fmt, top):
    # RE section 8 case 13: ml_dtypes, torchao, gfloat(sat), TE saturate to +-max; microxcaling
    # keeps +-Inf elementwise (its MX blocks are NaN anyway); gfloat with sat=False raises.
    x = torch.tensor([1e30, math.inf, -math.inf], dtype=torch.float32)
    sign = 1 << (get_format(fmt).bits - 1)
    expected = [top, top, top | sign]
    for saturate in (True, False):
        assert encode(x, fmt, saturate=saturate).tolist() == expected
    ml = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn}[fmt]
    w = Witnesses()
    w.expect("ml_dtypes", x.numpy().astype(ml).view(np.uint8).tolist(), tuple(expected), f"the {fmt} casts of 1e30, +-inf")
    with needs("gfloat"):
        import gfloat
        from gfloat import formats
    info = getattr(formats, f"format_info_ocp_{fmt}")
    try:
        outcome = repr(gfloat.round_float(info, 1e30, gfloat.RoundMode.TiesToEven, False))
    except ValueError:
        outcome = "ValueError"
    w.expect("gfloat", outcome, "ValueError", f"round_float({fmt}, 1e30, sat=False)")
    w.finish()


# ------------------------------------------------------------------ the command


def test_command_prints_the_per_class_table(capsys):
    code, out, err = run_cli(capsys, "divergence", "primus_turbo.mxfp4", "ocp")
    assert (code, err) == (0, "")
    assert out.startswith("primus_turbo.mxfp4 vs ocp: e2m1, blocks of 32, inputs 'standard', seed 0\n")
    assert "profiles differ in: scale_rule (even | floor)" in out
    table = out.split("\n\n")[1].split("\nexamples")[0]
    lines = {line.split()[0]: line.split() for line in table.splitlines()}
    report = div.divergence("primus_turbo.mxfp4", "ocp")
    for c in report.classes:
        assert lines[c.name][:2] == [c.name, "512"] and lines[c.name][2] == str(c.scale_diff)
    assert lines["nan"][-1] == "6" and lines["amax_pow2"][2] == "0"


def test_command_json_and_seed(capsys):
    code, out, _ = run_cli(capsys, "divergence", "aiter.mxfp6", "aiter.mxfp6.triton", "--json", "--seed", "3")
    assert code == 0
    data = json.loads(out)
    assert data == json.loads(json.dumps(div.divergence("aiter.mxfp6", "aiter.mxfp6.triton", seed=3).to_json()))
    assert data["seed"] == 3 and [c["name"] for c in data["classes"]] == list(div.INPUTS)


def test_command_table_as_text_and_json(capsys):
    code, out, _ = run_cli(capsys, "divergence", "--table")
    assert code == 0 and out == div.table_text()
    code, out, _ = run_cli(capsys, "divergence", "--table", "--json")
    assert code == 0 and len(json.loads(out)) == len(div.DIVERGENCE_TABLE) == 31


@pytest.mark.parametrize(("argv", "needle"), [
    (["nvidia", "ocp"], "unknown profile 'nvidia'; known profiles: ocp, primus_turbo.mxfp4, "),
    (["ocp"], "give two profiles A B (or --table); known profiles: ocp, "),
    (["ocp", "torchao.floor"], "both families: pass fmt"),
    (["te.mxfp8", "ocp", "--fmt", "e2m1"], "fmt='e2m1', but the profiles are pinned to e4m3"),
])
def test_command_errors_exit_2_with_one_line(capsys, argv, needle):
    code, out, err = run_cli(capsys, "divergence", *argv)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith("mxcheck divergence: error: ") and needle in err


def test_command_family_pair_takes_fmt(capsys):
    code, out, _ = run_cli(capsys, "divergence", "ocp", "torchao.floor", "--fmt", "e4m3")
    assert code == 0 and out.startswith("ocp vs torchao.floor: e4m3")


def test_command_options_say_their_defaults():
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for action in sub.choices["divergence"]._actions:
        if action.default not in (None, "==SUPPRESS==") and action.dest != "help":
            assert action.help.endswith("Default: %(default)r"), action.dest
