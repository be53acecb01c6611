"""The ``mxcheck`` command line: info, formats, report, compare; exit codes and errors.

Reports are the committed ones of tests/test_report/ (see tests/test_report.py for what
differs between baseline.json and small.json: 2 regressions, both pass -> fail).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import mxcheck
from mxcheck.cli import build_parser
from tests._helpers import run_cli

pytestmark = pytest.mark.emulated

ROOT = Path(__file__).parents[1]
DATA = ROOT / "tests" / "test_report"
SMALL = DATA / "small.json"
BASELINE = DATA / "baseline.json"
COMMAND_NAMES = ["conform", "search", "info", "formats", "report", "compare", "divergence", "lint", "tuned-coverage",
                 "aiter-log", "shapes", "sweep", "thresholds", "stats", "recipes", "profiles", "fit", "accuracy"]


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error: " in lines[0] and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


# ---- parser -------------------------------------------------------------------------


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in COMMAND_NAMES:
        assert re.search(rf"^ {{4}}{name}(\s|$)", out, re.MULTILINE), name


def test_every_option_with_a_default_says_it_in_its_help() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(sub.choices) == sorted(COMMAND_NAMES)
    checked = 0
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.default not in (None, argparse.SUPPRESS):
                assert action.help.endswith("Default: %(default)r"), (name, action.dest)
                checked += 1
    assert checked >= 4  # --json twice, --max-drop-db twice, --quiet


def test_no_command_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys)
    assert (code, out) == (2, "")
    assert_one_line_error(err, "a command is required", "info, formats, report, compare")


# ---- info ---------------------------------------------------------------------------


def test_info_json_describes_this_machine(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MXCHECK_FAKE_HARDWARE", raising=False)
    code, out, _ = run_cli(capsys, "info", "--json")
    info = json.loads(out)
    assert code == 0
    assert (info["mxcheck"], info["torch"]) == (mxcheck.__version__, torch.__version__)
    assert info["hardware"]["faked"] is False
    if not torch.cuda.is_available():
        assert (info["hardware"]["vendor"], info["hardware"]["device_count"]) == ("cpu", 0)
    assert set(info["packages"]) == {"torchao", "transformer_engine", "primus_turbo", "aiter",
                                     "triton", "ml_dtypes"}
    assert set(info["markers"]) == {"emulated", "gfx950", "gfx942", "cuda", "sm90", "sm100",
                                    "slow", "convergence"}
    assert info["markers"]["emulated"] == {"runs": True, "reason": None,
                                           "help": "runs on any CPU; no accelerator needed"}


def test_info_under_a_faked_gfx950_runs_gfx950_markers_and_skips_cuda_ones(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "gfx950")
    code, out, _ = run_cli(capsys, "info", "--json")
    info = json.loads(out)
    assert code == 0
    assert info["hardware"] | {"description": ""} == {
        "vendor": "amd", "arch": "gfx950", "name": "fake gfx950", "device_count": 1,
        "runtime": None, "faked": True, "description": ""}
    markers = info["markers"]
    assert [m for m in markers if markers[m]["runs"]] == ["emulated", "gfx950", "slow",
                                                           "convergence"]
    assert markers["cuda"]["reason"] == (
        "cuda: needs an NVIDIA CUDA GPU; this machine has 1 x fake gfx950 "
        "(gfx950, faked by MXCHECK_FAKE_HARDWARE)")
    assert markers["gfx942"]["reason"].startswith("gfx942: needs an AMD MI300X (gfx942) GPU;")

    code, out, _ = run_cli(capsys, "info")
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in
            out.split("markers here:\n")[1].splitlines()}
    assert rows["gfx950"][0] == "runs"
    assert rows["sm90"] == ["skips", "sm90: needs an NVIDIA Hopper (sm90) GPU; this machine "
                            "has 1 x fake gfx950 (gfx950, faked by MXCHECK_FAKE_HARDWARE)"]
    assert "  faked    yes (MXCHECK_FAKE_HARDWARE)" in out


def test_info_lists_each_backend_with_why_it_is_not_usable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    registry = types.ModuleType("mxcheck.backends")
    registry.available_backends = lambda: {  # type: ignore[attr-defined]
        "emulated": (True, ""), "aiter": (False, "aiter not importable (No module named 'aiter')")}
    monkeypatch.setitem(sys.modules, "mxcheck.backends", registry)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert ("backends:\n  emulated  usable\n"
            "  aiter     not usable: aiter not importable (No module named 'aiter')\n") in out
    _, out, _ = run_cli(capsys, "info", "--json")
    assert json.loads(out)["backends"]["aiter"] == {
        "usable": False, "reason": "aiter not importable (No module named 'aiter')"}


@pytest.mark.parametrize("registry", [None, types.ModuleType("mxcheck.backends")],
                         ids=["not-importable", "no-available_backends"])
def test_info_without_a_backend_registry_says_so(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 registry: object) -> None:
    monkeypatch.setitem(sys.modules, "mxcheck.backends", registry)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert "\nbackends: registry not available\n" in out
    _, out, _ = run_cli(capsys, "info", "--json")
    info = json.loads(out)
    assert (info["backends"], info["backends_error"]) == (None, "registry not available")


def test_info_with_a_malformed_fake_hardware_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHECK_FAKE_HARDWARE", "quantum")
    code, out, err = run_cli(capsys, "info")
    assert (code, out) == (2, "")
    assert_one_line_error(err, "mxcheck info: error: MXCHECK_FAKE_HARDWARE='quantum'")


def test_python_dash_m_mxcheck_runs_info() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), MXCHECK_FAKE_HARDWARE="sm90:2")
    proc = subprocess.run([sys.executable, "-m", "mxcheck", "info", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert (info["hardware"]["arch"], info["hardware"]["device_count"]) == ("sm90", 2)
    assert info["markers"]["cuda"]["runs"] and not info["markers"]["sm100"]["runs"]


# ---- formats ------------------------------------------------------------------------

# Independent literals: OCP Microscaling Formats (MX) v1.0 tables 1-2 (e2m1, e2m3, e3m2,
# e8m0), OCP 8-bit Floating Point v1.0 table 1 (e4m3, e5m2), the AMD fnuz types as
# torch.finfo(float8_e4m3fnuz / float8_e5m2fnuz) gives them, IEEE 754 binary16 and bfloat16.
# (name, bits, ebits, mbits, bias, emax, emin, max, min_normal, min_subnormal, NaN, Inf)
EXPECTED_FORMATS = [
    ("e2m1", 4, 2, 1, 1, 2, 0, 6.0, 1.0, 0.5, None, None),
    ("e2m3", 6, 2, 3, 1, 2, 0, 7.5, 1.0, 0.125, None, None),
    ("e3m2", 6, 3, 2, 3, 4, -2, 28.0, 0.25, 0.0625, None, None),
    ("e4m3", 8, 4, 3, 7, 8, -6, 448.0, 2.0**-6, 2.0**-9, 0x7F, None),
    ("e5m2", 8, 5, 2, 15, 15, -14, 57344.0, 2.0**-14, 2.0**-16, 0x7F, 0x7C),
    ("e4m3fnuz", 8, 4, 3, 8, 7, -7, 240.0, 2.0**-7, 2.0**-10, 0x80, None),
    ("e5m2fnuz", 8, 5, 2, 16, 15, -15, 57344.0, 2.0**-15, 2.0**-17, 0x80, None),
    ("e8m0", 8, 8, 0, 127, 127, -127, 2.0**127, 2.0**-127, None, 0xFF, None),
    ("ue4m3", 7, 4, 3, 7, 8, -6, 448.0, 2.0**-6, 2.0**-9, 0x7F, None),
    ("bf16", 16, 8, 7, 127, 127, -126, 3.3895313892515355e38, 2.0**-126, 2.0**-133, 0x7FFF, 0x7F80),
    ("fp16", 16, 5, 10, 15, 15, -14, 65504.0, 2.0**-14, 2.0**-24, 0x7FFF, 0x7C00),
]
FIELDS = ("name", "bits", "ebits", "mbits", "bias", "emax", "emin", "max", "min_normal",
          "min_subnormal", "nan_code", "inf_code")


def test_formats_json_gives_every_format_constant(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "formats", "--json")
    table = json.loads(out)
    assert code == 0
    assert list(table) == [row[0] for row in EXPECTED_FORMATS]
    for row in EXPECTED_FORMATS:
        got = tuple(table[row[0]][f] for f in FIELDS)
        assert got == row, row[0]


def test_formats_table_shows_values_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "formats")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "bits", "ebits", "mbits", "bias", "emax", "emin", "max",
                                "min", "normal", "min", "subnormal", "NaN", "code", "Inf", "code"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert len(rows) == len(EXPECTED_FORMATS)
    cells = rows["e4m3"].split("  ")
    cells = [c.strip() for c in cells if c.strip()]
    assert cells == ["e4m3", "8", "4", "3", "7", "8", "-6", "448", "2^-6 = 0.015625",
                     "2^-9 = 0.001953125", "0x7f (ocp)", "none"]
    assert " 2^127 ≈ 1.701e+38 " in rows["e8m0"] and " 2^-127 ≈ 5.877e-39 " in rows["e8m0"]
    assert " 255 * 2^120 ≈ 3.39e+38 " in rows["bf16"] and rows["bf16"].endswith("0x7f80")
    assert " 65504 " in rows["fp16"] and " 2^-24 ≈ 5.96e-08 " in rows["fp16"]
    assert " 7.5 " in rows["e2m3"] and " 2^-3 = 0.125 " in rows["e2m3"]


# ---- report -------------------------------------------------------------------------


@pytest.mark.usefixtures("matplotlib")
def test_report_writes_markdown_and_html_files(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    code, out, err = run_cli(capsys, "report", SMALL, "--md", md, "--html", html)
    assert (code, out) == (0, "")
    assert md.read_text(encoding="utf-8").splitlines()[0] == (
        "**mxcheck**: 15 checks, 4 failed, 2 skipped (2 other); worst: SNR is NaN "
        "(wgrad double_blocks.0.img_mod.lin, mxfp6/aiter)")
    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count('src="data:image/png;base64,') == 3
    assert "rendering Markdown (15 records)..." in err and "rendering HTML (15 records" in err
    assert f"wrote {md}" in err and f"wrote {html}" in err


def test_report_prints_markdown_without_an_output_and_is_quiet_when_asked(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "report", SMALL, "-q")
    assert (code, err) == (0, "")
    assert out.startswith("**mxcheck**: 15 checks, 4 failed, 2 skipped (2 other)")
    assert "#### mxfp4 / triton: 7 checks, 2 failed, worst margin -1.25 dB" in out


def test_report_against_a_baseline_uses_max_drop(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, "report", SMALL, "--baseline", BASELINE, "-q")
    assert ("Against the baseline (a drop over 0.5 dB regresses): 2 regressed, 1 improved, "
            "1 new, 1 missing") in out
    # A 2 dB margin turns the +1 dB qkv improvement into "within the margin".
    _, out, _ = run_cli(capsys, "report", SMALL, "--baseline", BASELINE, "--max-drop-db", "2", "-q")
    assert "(a drop over 2 dB regresses): 2 regressed, 0 improved" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "{tmp}/missing.json"], "mxcheck report: error: {tmp}/missing.json: cannot "
                                           "read report: "),
        (["report", "{tmp}/bad.json"], "mxcheck report: error: {tmp}/bad.json: not valid JSON"),
        (["report", SMALL, "--baseline", "{tmp}/missing.json"], "{tmp}/missing.json: cannot read"),
        (["report", SMALL, "--md", "{tmp}/no/such/dir/r.md", "-q"],
         "mxcheck report: error: {tmp}/no/such/dir/r.md: cannot write"),
        (["report", SMALL, "--max-drop-db", "-1"],
         "mxcheck report: error: argument --max-drop-db: max-drop-db must be >= 0, got -1.0"),
        (["compare", BASELINE, SMALL, "--max-drop-db", "-1"],
         "mxcheck compare: error: argument --max-drop-db: max-drop-db must be >= 0, got -1.0"),
        (["compare", BASELINE, SMALL, "--max-drop-db", "lots"], "got 'lots'"),
        (["compare", BASELINE, SMALL, "--max-drop-db", "nan"], "must be finite, got nan"),
        (["compare", BASELINE], "the following arguments are required: NEW.json"),
        (["formats", "--jsn"], "unrecognized arguments: --jsn"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
    ids=["missing-input", "invalid-input", "missing-baseline", "unwritable-output",
         "report-negative-drop", "compare-negative-drop", "drop-not-a-number", "drop-nan",
         "missing-argument", "unknown-option", "unknown-command"],
)
def test_bad_input_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           argv: list[str], message: str) -> None:
    (tmp_path / "bad.json").write_text('{"version": 1, "records": [', encoding="utf-8")
    code, out, err = run_cli(capsys, *(str(a).replace("{tmp}", str(tmp_path)) for a in argv))
    assert (code, out) == (2, "")
    assert_one_line_error(err, message.replace("{tmp}", str(tmp_path)))


# ---- compare ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "new", "code", "last_line"),
    [(SMALL, SMALL, 0, "OK"), (BASELINE, BASELINE, 0, "OK"),
     (BASELINE, SMALL, 1, "FAIL: 2 regression(s)")],
    ids=["same", "same-baseline", "regressed"],
)
def test_compare_exit_code_says_whether_anything_regressed(
        capsys: pytest.CaptureFixture[str], base: Path, new: Path, code: int,
        last_line: str) -> None:
    got, out, err = run_cli(capsys, "compare", base, new)
    assert (got, err) == (code, "")
    assert out.splitlines()[0].endswith("(max drop 0.5 dB)")
    assert out.splitlines()[-1] == last_line


def test_compare_lists_what_moved_with_the_given_margin(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", BASELINE, SMALL, "--max-drop-db", "2")
    assert code == 1  # both regressions are pass -> fail, which no margin excuses
    assert out.splitlines()[0] == ("mxcheck compare: 2 regressed, 0 improved, 1 added, "
                                   "1 not run, 12 unchanged (max drop 2 dB)")
    assert "REGRESSIONS (2):\n  mxfp4/triton wgrad double_blocks.0.img_mlp.0 " in out
    assert "SNR 10.50 -> 8.75 dB (drop 1.75 dB > 2)" not in out and "passed -> FAILED" in out


def test_compare_of_an_unreadable_file_is_exit_2(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    code, out, err = run_cli(capsys, "compare", SMALL, tmp_path / "bad.json")
    assert (code, out) == (2, "")
    assert_one_line_error(err, f"mxcheck compare: error: {tmp_path / 'bad.json'}: not valid JSON")


# ---- a comment that fits; no crash escapes as a traceback or exit 1 ----------------------


def test_report_max_chars_cuts_the_markdown_and_0_keeps_it_whole(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    records = [{"test_id": f"tests/t.py::test_x[{i}]", "backend": "triton", "recipe": "mxfp4",
                "layer": f"blocks.{i}", "direction": "fwd", "snr_db": 20.0 + i,
                "threshold_db": 10.0, "passed": i % 100 != 0} for i in range(3000)]
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"version": 1, "records": records}), encoding="utf-8")
    code, out, _ = run_cli(capsys, "report", big, "-q")  # the default: a comment GitHub accepts
    assert code == 0 and len(out) <= 65_000 < len(run_cli(capsys, "report", big, "-q",
                                                        "--max-chars", "0")[1])
    assert out.count("❌") == 30  # every failure
    assert "(cut to fit a GitHub comment); full report in the `mxcheck-report` artifact*" in out
    code, out, _ = run_cli(capsys, "report", big, "-q", "--max-chars", "5000", "--artifact", "rep-cuda")
    assert code == 0 and len(out) <= 5000 and "`rep-cuda` artifact" in out


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "argument --max-chars: max-chars must be a number of characters >= 0 (0: no limit), "
           "got '-1'"),
    ("lots", "got 'lots'"),
    ("50", "max_chars=50 is shorter than the summary"),
])
def test_report_bad_max_chars_is_exit_2(capsys: pytest.CaptureFixture[str], value: str,
                                        message: str) -> None:
    code, out, err = run_cli(capsys, "report", SMALL, "-q", "--max-chars", value)
    assert (code, out) == (2, "")
    assert_one_line_error(err, message)


@pytest.mark.parametrize("command", ["report", "compare"])
def test_deeply_nested_json_is_exit_2_naming_the_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                    encoding="utf-8")
    argv = [command, deep] if command == "report" else [command, SMALL, deep]
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert_one_line_error(err, f"mxcheck {command}: error: {deep}: JSON too deeply nested")


def test_an_unexpected_exception_is_exit_2_with_one_line_naming_the_inputs(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    def crash(*args: object, **kwargs: object) -> str:
        raise KeyError("snr_db\nsecond line")

    monkeypatch.setattr("mxcheck.cli.reports.render_markdown", crash)
    code, out, err = run_cli(capsys, "report", SMALL, "--md", tmp_path / "c.md", "-q")
    assert (code, out) == (2, "")
    assert_one_line_error(err, f"mxcheck report: error: on input={SMALL}, md={tmp_path / 'c.md'}: "
                               "unexpected KeyError: 'snr_db\\nsecond line' (a bug in mxcheck")
    monkeypatch.setattr("mxcheck.cli.about.collect_info", lambda: 1 / 0)
    code, _, err = run_cli(capsys, "info")  # no file arguments: nothing to name
    assert code == 2
    assert_one_line_error(err, "mxcheck info: error: unexpected ZeroDivisionError: division by zero")


# ---- recipes and profiles -------------------------------------------------------------------

def test_recipes_lists_every_built_in_recipe_with_its_source_and_each_copy(capsys: pytest.CaptureFixture[str]) -> None:
    from mxcheck.recipes import DERIVED_RECIPES, OCP_MX_RECIPES, OPERANDS, PLAIN_RECIPES, RECIPES

    code, out, _ = run_cli(capsys, "recipes", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [r["name"] for r in rows] == [*RECIPES, *PLAIN_RECIPES, *OCP_MX_RECIPES, *DERIVED_RECIPES]
    assert all(r["source"] and list(r["operands"]) == list(OPERANDS) for r in rows)
    plain = next(r for r in rows if r["name"] == "nvfp4-1x16")
    assert set(plain["operands"].values()) == {"e2m1, nvfp4, 1x16 blocks, rne"}
    te = next(r for r in rows if r["name"] == "nvfp4")
    assert te["operands"]["w_row"] == "e2m1, nvfp4, 16x16 blocks, rne"
    assert te["operands"]["g_col"] == "e2m1, nvfp4, 1x16 blocks, sr, hadamard='h16_te'"
    code, text, _ = run_cli(capsys, "recipes")
    assert code == 0 and "\nnvfp4-1x16\n  source: NVIDIA NVFP4" in text
    assert "    w_row  e2m1, nvfp4, 16x16 blocks, rne\n" in text


def test_profiles_lists_every_profile_and_prints_every_field_of_one(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from mxcheck.profiles import ALL_PROFILES

    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0 and all(re.search(rf"^{re.escape(n)} ", out, re.MULTILINE) for n in ALL_PROFILES)
    code, out, _ = run_cli(capsys, "profiles", "modelopt.nvfp4", "--json")
    fields = json.loads(out)["modelopt.nvfp4"]
    assert code == 0
    assert list(fields) == ["kind", "scaling", *(f.name for f in dataclasses.fields(ALL_PROFILES["modelopt.nvfp4"]))]
    assert (fields["kind"], fields["zero_sign"], fields["block_scale_min"]) == ("NVFP4Profile", "negative_values", 2**-9)
    code, out, _ = run_cli(capsys, "profiles", "te.mxfp8")
    assert code == 0 and re.search(r"^scale_rule +'rceil'$", out, re.MULTILINE), out


def test_an_unknown_profile_is_a_one_line_error_naming_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "profiles", "modelopt.nvfp")
    assert code == 2
    assert_one_line_error(err, "profile 'modelopt.nvfp' is not known; did you mean 'modelopt.nvfp4'?")
