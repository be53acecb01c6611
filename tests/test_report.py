"""Reports: the JSON schema, Markdown and HTML renderings, and `compare` between two runs.

Rendering is checked against the small committed reports in tests/test_report/
(small.json: 15 checks over fp8/emulated, mxfp4/triton and mxfp6/aiter, 4 failing, 2
skipped; baseline.json: the same run before a regression, written by hand so that each
difference below is known: fwd img_mlp.0 18.75 -> 18.25 dB, wgrad img_mlp.0 10.5 pass ->
8.75 fail, dgrad single_blocks.0.linear2 10.25 pass -> 9.75 fail, mxfp6 fwd qkv 27.5 ->
28.5, single_blocks.1.linear2 added, single_blocks.1.linear1 removed).
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import random
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import mxcheck
from mxcheck.report import (
    Record,
    Report,
    ReportError,
    collect_environment,
    compare,
    compare_files,
    render_html,
    render_markdown,
)
from mxcheck.report.compare import match_key, snr_drop_db
from mxcheck.report.environment import device_info, git_info, package_versions
from mxcheck.report.html import snr_figure
from mxcheck.report.markdown import group_rows, worst

pytestmark = pytest.mark.emulated

DATA = Path(__file__).with_suffix("")  # tests/test_report/
SMALL = DATA / "small.json"
BASELINE = DATA / "baseline.json"
VENDOR = ("torchao", "transformer_engine", "primus_turbo", "aiter", "triton", "ml_dtypes")


@pytest.fixture(scope="module")
def small() -> Report:
    return Report.load(SMALL)


@pytest.fixture(scope="module")
def baseline() -> Report:
    return Report.load(BASELINE)


def snr_record(snr: float | None, *, passed: bool = True, **kw: object) -> Record:
    fields = dict(test_id="tests/t.py::test_linear[mxfp4-triton]", backend="triton",
                  recipe="mxfp4", layer="double_blocks.0.img_mlp.0", m=4096, n=12288, k=3072,
                  direction="wgrad", snr_db=snr, threshold_db=10.0, passed=passed)
    fields.update(kw)
    return Record(**fields)


# ---- schema ---------------------------------------------------------------------------


def test_record_round_trips_through_json_text_with_nan_and_inf() -> None:
    r = snr_record(math.nan, passed=False, threshold_db=math.inf, cosine=-math.inf,
                   max_abs_error=0.1, bit_equal=False, mismatches=3, total=16,
                   message="SNR nan", extra={"seed": 7})
    text = json.dumps(r.to_json(), allow_nan=False)  # plain JSON: no bare NaN/Infinity
    stored = json.loads(text)
    assert (stored["snr_db"], stored["threshold_db"], stored["cosine"]) == ("nan", "inf", "-inf")
    back = Record.from_json(stored)
    assert math.isnan(back.snr_db)
    assert (back.threshold_db, back.cosine) == (math.inf, -math.inf)
    assert back.to_json() == r.to_json()
    assert (back.max_abs_error, back.mismatches, back.extra) == (0.1, 3, {"seed": 7})


def test_record_rejects_an_unknown_direction() -> None:
    with pytest.raises(ValueError, match=r"direction='fwdd'.*fwd"):
        snr_record(20.0, direction="fwdd")


def test_committed_reports_are_in_canonical_form(small: Report, baseline: Report) -> None:
    # Loading and saving changes nothing: the committed files are what save() writes.
    assert small.dumps() == SMALL.read_text(encoding="utf-8")
    assert baseline.dumps() == BASELINE.read_text(encoding="utf-8")


def test_save_gives_identical_bytes_whatever_the_order_of_arrival(small: Report,
                                                                  tmp_path: Path) -> None:
    rng = random.Random(0)
    outputs = set()
    for i in range(4):
        records, skipped = list(small.records), list(small.skipped)
        rng.shuffle(records)
        rng.shuffle(skipped)
        Report(environment=dict(small.environment), records=records,
               skipped=skipped).save(tmp_path / f"{i}.json")
        outputs.add((tmp_path / f"{i}.json").read_bytes())
    assert outputs == {SMALL.read_bytes()}


def test_merge_of_worker_reports_equals_the_whole_run(small: Report) -> None:
    parts = [Report(environment=dict(small.environment), records=small.records[i::3],
                    skipped=small.skipped[i::3]) for i in range(3)]
    assert Report.merge(parts).dumps() == SMALL.read_text(encoding="utf-8")
    assert Report.merge(parts[::-1]).dumps() == SMALL.read_text(encoding="utf-8")
    assert Report.merge(parts).records == Report.merge(parts[::-1]).records


def test_witness_drifts_merge_sorted_round_trip_and_are_absent_when_none(small: Report) -> None:
    drifts = [{"test_id": f"t{i}", "reason": f"witness drift: torch 2.14.0 gives 0x0{i}"} for i in (2, 1)]
    parts = [Report(environment=dict(small.environment), records=small.records, witness_drifts=drifts[:1]),
             Report(witness_drifts=drifts[1:])]
    merged = Report.merge(parts)
    assert merged.witness_drifts == drifts[::-1] == Report.merge(parts[::-1]).witness_drifts
    assert Report.loads(merged.dumps()).witness_drifts == drifts[::-1]
    assert json.loads(merged.dumps())["witness_drifts"] == drifts[::-1]
    assert "witness_drifts" not in json.loads(small.dumps())  # reports without drift read as before


def test_merge_keeps_every_value_of_an_environment_key_that_differs() -> None:
    a = Report(environment={"device": "MI355X", "seed": 1})
    b = Report(environment={"device": "MI300X", "seed": 1})
    assert Report.merge([a, b]).environment == {"device": ["MI300X", "MI355X"], "seed": 1}
    assert Report.merge([b, a]).environment == Report.merge([a, b]).environment


def test_unknown_keys_from_a_newer_writer_survive_load_and_save(tmp_path: Path) -> None:
    data = json.loads(SMALL.read_text(encoding="utf-8"))
    data["precision_manifest"] = {"double_blocks.0.img_mlp.0": "mxfp4"}
    data["records"][0]["kernel"] = "gemm_a4w4"
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    again = json.loads(Report.load(path).dumps())
    assert again["precision_manifest"] == {"double_blocks.0.img_mlp.0": "mxfp4"}
    assert again["records"][0]["kernel"] == "gemm_a4w4"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"version": 1, "records": [', r"not valid JSON: .* line 1 column"),
        ('{"version": 2, "records": []}', r"version=2; this mxcheck reads version 1"),
        ('{"records": []}', r"version=None"),
        ('{"version": 1, "records": [{"test_id": "t", "backend": "b", "recipe": "r", '
         '"passed": true, "direction": "up"}]}', r"records\[0\]: direction='up'"),
        ('{"version": 1, "skipped": [{"test_id": "t"}]}', r"skipped\[0\]"),
        ('{"version": 1, "witness_drifts": [{"reason": "r"}]}', r"witness_drifts\[0\]=\{'reason': 'r'\}"),
    ],
    ids=["truncated", "newer-version", "no-version", "bad-direction", "skip-without-reason",
         "drift-without-test"],
)
def test_load_error_names_the_file_and_the_problem(tmp_path: Path, text: str,
                                                   problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReportError, match=problem) as info:
        Report.load(path)
    assert str(info.value).startswith(f"{path}: ")


def test_load_of_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"missing\.json: cannot read report"):
        Report.load(tmp_path / "missing.json")


# ---- environment ----------------------------------------------------------------------


def test_environment_records_provenance_and_imports_no_vendor_package() -> None:
    # A fresh interpreter: this session may already have imported torchao or ml_dtypes.
    code = ("import json, sys; from mxcheck.report import collect_environment; "
            "env = collect_environment(seed=3, backends=['triton', 'emulated']); "
            f"print(json.dumps([env, sorted(m for m in sys.modules if m.split('.')[0] in {VENDOR!r} "
            "or m == 'matplotlib')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1], timeout=120)
    env, imported = json.loads(out.stdout)
    assert imported == []
    assert (env["mxcheck"], env["torch"]) == (mxcheck.__version__, torch.__version__)
    assert (env["seed"], env["backends"]) == (3, ["emulated", "triton"])
    assert set(env["packages"]) == set(VENDOR)
    assert env["git_sha"] is None or len(env["git_sha"]) == 40
    if not torch.cuda.is_available():
        assert (env["device"], env["arch"]) == ("cpu", "cpu")


def test_a_package_that_is_not_installed_has_no_version() -> None:
    assert package_versions(["mxcheck_surely_absent_pkg"]) == {"mxcheck_surely_absent_pkg": None}


def test_git_sha_is_none_outside_a_repository(tmp_path: Path) -> None:
    assert git_info(tmp_path) == {"git_sha": None, "git_dirty": None}
    assert collect_environment(cwd=tmp_path)["git_sha"] is None


@pytest.mark.parametrize(
    ("hip", "props", "arch"),
    [
        ("7.0.0", {"name": "AMD Instinct MI355X", "gcnArchName": "gfx950:sramecc+:xnack-",
                   "major": 9, "minor": 5}, "gfx950"),
        (None, {"name": "NVIDIA H100", "major": 9, "minor": 0}, "sm90"),
        (None, {"name": "NVIDIA B200", "major": 10, "minor": 0}, "sm100"),
    ],
    ids=["rocm-gfx950", "cuda-sm90", "cuda-sm100"],
)
def test_device_arch_is_read_from_device_properties(monkeypatch: pytest.MonkeyPatch,
                                                    hip: str | None, props: dict,
                                                    arch: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(**props))
    monkeypatch.setattr(torch.version, "hip", hip)
    info = device_info()
    assert (info["device"], info["arch"], info["device_count"]) == (props["name"], arch, 8)


# ---- markdown -------------------------------------------------------------------------


def table_after(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells) of the first table after the line starting with ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]  # drop the header and the |---| line


def test_markdown_starts_with_a_summary_line(small: Report) -> None:
    first = render_markdown(small).splitlines()[0]
    assert first == ("**mxcheck**: 15 checks, 4 failed, 2 skipped (2 other); worst: SNR "
                     "is NaN (wgrad double_blocks.0.img_mod.lin, mxfp6/aiter)")


def test_markdown_has_one_table_per_recipe_and_backend(small: Report) -> None:
    headings = [line for line in render_markdown(small).splitlines() if line.startswith("#### ")]
    assert headings == [
        "#### fp8 / emulated: 3 checks, 0 failed, worst margin +6.00 dB",
        "#### mxfp4 / triton: 7 checks, 2 failed, worst margin -1.25 dB",
        "#### mxfp6 / aiter: 5 checks, 2 failed, worst: SNR is NaN",
        "#### Skipped (2)",
    ]


def test_markdown_lists_failures_first_then_smallest_margin(small: Report) -> None:
    rows = table_after(render_markdown(small), "#### mxfp4 / triton")
    assert [(r[1], r[5], r[-1]) for r in rows] == [
        ("wgrad", "-1.25", "❌"), ("dgrad", "-0.25", "❌"), ("wgrad", "+5.50", "✅"),
        ("fwd", "+7.00", "✅"), ("fwd", "+7.25", "✅"), ("dgrad", "+7.50", "✅"),
        ("fwd", "+8.25", "✅")]
    assert "double_blocks.0.img_mlp.0<br>" in rows[0][0]
    assert "↳ SNR 8.75 dB &lt; 10.0 dB" in rows[0][0]
    # mxfp6: a failed bitwise check has no margin, yet sorts above every pass.
    rows = table_after(render_markdown(small), "#### mxfp6 / aiter")
    assert [(r[1], r[5], r[-1]) for r in rows] == [
        ("wgrad", "nan", "❌"), ("quantize", "–", "❌"), ("fwd", "+4.50", "✅"),
        ("bgrad", "+6.00", "✅"), ("quantize", "–", "✅")]


def test_markdown_shows_bitwise_mismatches(small: Report) -> None:
    rows = table_after(render_markdown(small), "#### mxfp6 / aiter")
    assert [(r[1], r[6], r[-1]) for r in rows if r[1] == "quantize"] == [
        ("quantize", "12 / 12,582,912", "❌"), ("quantize", "equal", "✅")]


def test_markdown_ends_with_the_skipped_checks_and_their_reasons(small: Report) -> None:
    text = render_markdown(small)
    assert text.index("#### Skipped (2)") > text.index("#### mxfp6 / aiter")
    assert ("- tests/test_flux_linears.py::test_linear_snr[mxfp8-torchao-double_blocks.0."
            "img_mlp.0]: torchao not importable (No module named 'torchao')") in text


def test_markdown_baseline_adds_a_delta_column_that_flags_regressions(
        small: Report, baseline: Report) -> None:
    assert "Δ baseline" not in render_markdown(small)
    text = render_markdown(small, baseline, max_drop_db=0.5)
    assert ("Against the baseline (a drop over 0.5 dB regresses): 2 regressed, 1 improved, "
            "1 new, 1 missing") in text
    deltas = {(r[0].split("<br>")[0], r[1]): r[6] for r in table_after(text, "#### mxfp4")}
    assert deltas[("double_blocks.0.img_mlp.0", "wgrad")] == "**-1.75** ⚠"
    assert deltas[("double_blocks.0.img_mlp.0", "fwd")] == "-0.50"  # not more than 0.5
    assert deltas[("single_blocks.1.linear2", "fwd")] == "new"
    assert deltas[("single_blocks.0.linear2", "fwd")] == "+0.00"
    assert "#### Not run: in the baseline, missing from this run (1)" in text
    tighter = table_after(render_markdown(small, baseline, max_drop_db=0.3), "#### mxfp4")
    assert "**-0.50** ⚠" in [r[6] for r in tighter if r[1] == "fwd"]


def test_markdown_escapes_cell_text_and_folds_long_tables() -> None:
    records = [snr_record(20.0 + i, layer=f"blocks.{i}") for i in range(11)]
    records.append(snr_record(5.0, passed=False, layer="a|b", test_id="t.py::x[<script>]"))
    text = render_markdown(Report(records=records))
    assert "<script>" not in text and "t.py::x[&lt;script&gt;]" in text
    assert "a\\|b<br>" in text
    assert "<details open><summary><b>mxfp4 / triton: 12 checks, 1 failed" in text
    # 8 columns without a baseline: the escaped pipe did not open a ninth.
    assert all(line.count(" | ") == 7 for line in text.splitlines() if line.startswith("| "))


# ---- html -----------------------------------------------------------------------------


class TagChecker(HTMLParser):
    """Records every start tag and fails on an end tag that does not close the open one."""

    VOID: ClassVar[set[str]] = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.seen: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.seen.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()


def parse(page: str) -> TagChecker:
    checker = TagChecker()
    checker.feed(page)
    checker.close()
    assert checker.open == []
    return checker


@pytest.fixture(scope="module")
def page(small: Report) -> str:
    return render_html(small)


@pytest.mark.usefixtures("matplotlib")
def test_html_is_well_formed_and_embeds_a_png_per_recipe_and_backend(page: str) -> None:
    tags = parse(page).seen
    images = [a["src"] for t, a in tags if t == "img"]
    assert len(images) == 3  # fp8/emulated, mxfp4/triton, mxfp6/aiter
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(t in ("script", "link") for t, _ in tags)  # nothing loaded from outside
    assert 'class="note"' not in page  # the no-plots note is for pages without matplotlib


def test_html_has_tables_skipped_and_environment_sections(page: str) -> None:
    headings = [h for h in page.splitlines() if h.startswith("<h2>")]
    assert [h.split(":")[0] for h in headings[:3]] == [
        "<h2>fp8 / emulated", "<h2>mxfp4 / triton", "<h2>mxfp6 / aiter"]
    assert headings[3:] == ["<h2>Skipped (2)</h2>", "<h2>Environment</h2>"]
    assert "<td>packages.torchao</td><td>not installed</td>" in page
    assert page.index("wgrad</td>") < page.index("dgrad</td>")  # mxfp4: failures first


def test_html_with_a_baseline_adds_the_delta_column(small: Report, baseline: Report,
                                                    page: str) -> None:
    with_base = render_html(small, baseline)
    parse(with_base)
    assert "<th>Δ baseline</th>" in with_base and "<th>Δ baseline</th>" not in page
    assert '<td class="num bad">-1.75</td>' in with_base


def drawn(fig: object, gid: str) -> list[float]:
    """The y values of the scatter points a figure drew under ``gid``, sorted."""
    ax = fig.axes[0]
    return sorted(float(y) for c in ax.collections if c.get_gid() == gid
                  for _, y in c.get_offsets())


@pytest.mark.usefixtures("matplotlib")
def test_plot_draws_snr_thresholds_failures_and_the_baseline(small: Report,
                                                             baseline: Report) -> None:
    rows = group_rows(small)[("mxfp4", "triton")]
    base = {match_key(r): r.snr_db for r in baseline.records}
    fig = snr_figure("mxfp4 / triton", rows, base)
    assert drawn(fig, "snr") == [8.75, 9.75, 15.5, 17.0, 17.25, 17.5, 18.25]
    assert drawn(fig, "threshold") == [10.0] * 7
    assert drawn(fig, "failed") == [8.75, 9.75]
    # Baseline SNRs of the six checks it has (single_blocks.1.linear2 is new), from the file.
    assert drawn(fig, "baseline") == [10.25, 10.5, 15.5, 17.0, 17.5, 18.75]
    assert drawn(snr_figure("mxfp4 / triton", rows, {}), "baseline") == []


def test_html_escapes_a_script_in_a_test_id() -> None:
    evil = "tests/t.py::test[<script>alert(1)</script>]"
    report = Report(records=[snr_record(20.0, test_id=evil, layer=None)],
                    skipped=[{"test_id": evil, "reason": "<b>no GPU</b>"}])
    html_text = render_html(report)
    assert "<script>" not in html_text and "<b>no GPU" not in html_text
    assert "test[&lt;script&gt;alert(1)&lt;/script&gt;]" in html_text
    assert "script" not in {t for t, _ in parse(html_text).seen}


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: ImportError


@pytest.mark.usefixtures("no_matplotlib")
def test_html_without_matplotlib_has_every_table_and_says_why_it_has_no_plots(
        small: Report) -> None:
    page = render_html(small)
    tags = [t for t, _ in parse(page).seen]
    assert tags.count("img") == 0 and tags.count("table") == 5  # 3 groups, skipped, environment
    assert page.count(">pass</td>") + page.count(">FAIL</td>") == 15  # every check of small.json
    note = next(line for line in page.splitlines() if line.startswith('<p class="note">'))
    assert "matplotlib, which is not installed" in note and "pip install mxcheck[plots]" in note


@pytest.mark.usefixtures("no_matplotlib")
def test_report_html_command_writes_a_page_without_matplotlib(tmp_path: Path) -> None:
    from mxcheck.cli import main

    out = tmp_path / "r.html"
    assert main(["report", str(SMALL), "--html", str(out), "-q"]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count("<h2>") == 5 and "src=\"data:image/png" not in page
    assert "pip install mxcheck[plots]" in page


# ---- compare --------------------------------------------------------------------------


def save_pair(tmp_path: Path, base: list[Record], new: list[Record]) -> tuple[Path, Path]:
    Report(records=base).save(tmp_path / "base.json")
    Report(records=new).save(tmp_path / "new.json")
    return tmp_path / "base.json", tmp_path / "new.json"


@pytest.mark.parametrize(("max_drop", "code"), [(0.3, 1), (1.0, 0)])
def test_an_snr_drop_beyond_max_drop_is_a_regression(tmp_path: Path, max_drop: float,
                                                     code: int) -> None:
    paths = save_pair(tmp_path, [snr_record(18.75)], [snr_record(18.25)])
    exit_code, text = compare_files(*paths, max_drop_db=max_drop)
    assert exit_code == code
    assert ("SNR 18.75 -> 18.25 dB (drop 0.50 dB > 0.3)" in text) == (code == 1)
    assert text.splitlines()[-1] == ("FAIL: 1 regression(s)" if code else "OK")


def test_pass_to_fail_is_a_regression_even_within_the_margin(tmp_path: Path) -> None:
    paths = save_pair(tmp_path, [snr_record(10.25, threshold_db=10.1)],
                      [snr_record(10.0, threshold_db=10.1, passed=False)])
    exit_code, text = compare_files(*paths, max_drop_db=1.0)
    assert exit_code == 1
    assert "passed -> FAILED" in text and "(drop" not in text


def test_losing_bit_equality_is_a_regression(tmp_path: Path) -> None:
    bits = dict(kind="bitwise", snr_db=None, threshold_db=None, total=4096)
    paths = save_pair(tmp_path, [snr_record(None, bit_equal=True, mismatches=0, **bits)],
                      [snr_record(None, bit_equal=False, mismatches=12, **bits)])
    assert compare_files(*paths, max_drop_db=1.0) == (1, compare_files(*paths, 1.0)[1])
    assert "bit-equal -> 12 of 4,096 differ" in compare_files(*paths, 1.0)[1]


def test_added_and_removed_checks_are_reported_but_do_not_fail(tmp_path: Path) -> None:
    paths = save_pair(tmp_path, [snr_record(18.0, layer="old.layer")],
                      [snr_record(18.0, layer="new.layer")])
    exit_code, text = compare_files(*paths, max_drop_db=0.5)
    assert exit_code == 0
    assert "Added (1):\n  mxfp4/triton wgrad new.layer" in text
    assert "Not run (in the base, missing from this report) (1):\n  mxfp4/triton wgrad old.layer" in text


def test_compare_of_the_committed_reports(small: Report, baseline: Report) -> None:
    c = compare(baseline, small, max_drop_db=0.5)
    assert [(ch.new.layer, ch.new.direction) for ch in c.regressions] == [
        ("double_blocks.0.img_mlp.0", "wgrad"), ("single_blocks.0.linear2", "dgrad")]
    assert [(ch.new.layer, ch.new.direction) for ch in c.improvements] == [
        ("double_blocks.0.img_attn.qkv", "fwd")]
    assert [r.layer for r in c.added] == ["single_blocks.1.linear2"]
    assert [r.layer for r in c.removed] == ["single_blocks.1.linear1"]
    assert c.environment["torch"] == ("2.12.0", "2.13.0") and not c.ok


@pytest.mark.parametrize(
    ("base", "new", "drop"),
    [(18.75, 18.25, 0.5), (math.inf, 30.0, math.inf), (30.0, math.inf, -math.inf),
     (math.inf, math.inf, 0.0), (20.0, math.nan, math.inf), (math.nan, 20.0, -math.inf),
     (math.nan, math.nan, None), (None, 20.0, None)],
    ids=["finite", "lost-bit-exact", "became-bit-exact", "stayed-bit-exact", "lost-signal",
         "gained-signal", "no-signal-either", "no-baseline-snr"],
)
def test_snr_drop_follows_what_inf_and_nan_mean(base: float | None, new: float | None,
                                                drop: float | None) -> None:
    assert snr_drop_db(base, new) == drop


def test_compare_files_reports_an_unreadable_file_as_exit_code_2(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    code, text = compare_files(tmp_path / "bad.json", SMALL, 0.5)
    assert code == 2 and "bad.json: not valid JSON" in text


def test_compare_rejects_a_negative_max_drop(small: Report) -> None:
    with pytest.raises(ValueError, match=r"max_drop_db=-1"):
        compare(small, small, -1)


# ---- a comment that fits GitHub's 65,536 characters -------------------------------------


def many_records(n_pass: int, n_fail: int) -> Report:
    """n_pass passing records over three groups with margins 1..n_pass dB, n_fail failing
    ones with a message, and 50 skips: far longer than a small comment limit."""
    groups = [("mxfp4", "triton"), ("mxfp6", "aiter"), ("fp8", "emulated")]
    records = [snr_record(11.0 + i, recipe=groups[i % 3][0], backend=groups[i % 3][1],
                          layer=f"blocks.{i}") for i in range(n_pass)]
    records += [snr_record(5.0, passed=False, layer=f"failing.{i}",
                           message=f"SNR 5.00 dB < 10.0 dB at failing.{i}") for i in range(n_fail)]
    skipped = [{"test_id": f"tests/t.py::test_gpu[{i}]", "reason": "gfx950: needs an MI355X"}
               for i in range(50)]
    return Report(records=records, skipped=skipped)


def shown_layers(text: str) -> list[str]:
    return [line[2:].split("<br>")[0] for line in text.splitlines()
            if line.startswith("| ") and "<br>" in line]


def test_worst_is_the_smallest_margin_then_the_first_layer_whatever_the_order() -> None:
    tied = [snr_record(snr, layer=layer) for snr, layer in
            [(12.0, "b"), (11.0, "d"), (11.0, "c"), (11.0, "e"), (None, "a"), (30.0, "a")]]
    for order in itertools.permutations(tied):
        assert (worst(list(order)).layer, worst(list(order)).snr_db) == ("c", 11.0)
    nan = snr_record(math.nan, passed=False, layer="z")
    assert worst([*tied, nan]) is nan  # a NaN margin is the worst of all
    assert worst([snr_record(None)]) is None


def test_a_long_report_is_cut_to_max_chars_keeping_failures_and_smallest_margins() -> None:
    report = many_records(n_pass=2000, n_fail=40)
    full = render_markdown(report)
    text = render_markdown(report, max_chars=20_000)
    assert len(full) > 100_000 and len(text) <= 20_000
    assert text.splitlines()[0] == full.splitlines()[0]  # the summary line, untouched
    layers = shown_layers(text)
    assert {f"failing.{i}" for i in range(40)} <= set(layers)
    kept = sorted(int(x.split(".")[1]) for x in layers if x.startswith("blocks."))
    # Passing rows go smallest margin first: blocks.0 .. blocks.(n-1), no gaps.
    assert kept == list(range(len(kept))) and 0 < len(kept) < 2000
    cut = 2040 - len(layers)
    assert text.splitlines()[2] == (
        f"*… and {cut:,} more records, 50 more skips (cut to fit a GitHub comment); full report "
        "in the `mxcheck-report` artifact*")
    assert "#### Skipped" not in text
    assert text.rstrip().endswith("</sub>")  # the provenance line stays


def test_when_failures_alone_overflow_only_failures_are_shown_and_counted() -> None:
    report = many_records(n_pass=30, n_fail=500)
    text = render_markdown(report, max_chars=8_000, artifact="mxcheck-report-gfx950")
    layers = shown_layers(text)
    assert len(text) <= 8_000 and 0 < len(layers) < 500
    assert all(x.startswith("failing.") for x in layers)
    assert f"*… and {530 - len(layers):,} more records, 50 more skips" in text
    assert "`mxcheck-report-gfx950` artifact" in text
    assert f"mxfp4 / triton: 510 checks, 500 failed, worst margin -5.00 dB (showing {len(layers)})" \
        in text


def test_the_cut_note_names_only_what_was_cut() -> None:
    # Every record fits and only skips are cut: the note counts the skips alone (it said
    # "… and 0 more records, 12 more skips" before), one of a kind in the singular.
    report = many_records(n_pass=20, n_fail=2)
    full = render_markdown(report)
    text = render_markdown(report, max_chars=len(full) - 1200)
    assert set(shown_layers(text)) == set(shown_layers(full)) and len(shown_layers(full)) == 22
    note = text.splitlines()[2]
    shown = int(text.split("Skipped (50, showing ")[1].split(")")[0])
    assert note == (f"*… and {50 - shown} more skips (cut to fit a GitHub comment); full report in the "
                    "`mxcheck-report` artifact*")


def test_a_report_that_fits_is_unchanged_by_max_chars(small: Report, baseline: Report) -> None:
    for base in (None, baseline):
        full = render_markdown(small, base)
        assert render_markdown(small, base, max_chars=65_000) == full
        assert render_markdown(small, base, max_chars=len(full)) == full
        cut = render_markdown(small, base, max_chars=len(full) - 1)
        # one character over: the last skip goes, and the note counts that alone
        assert len(cut) < len(full) and "*… and 1 more skip (cut to fit" in cut and " 0 more " not in cut


def test_max_chars_below_the_summary_is_a_value_error(small: Report) -> None:
    with pytest.raises(ValueError, match=r"max_chars=100 is shorter than the summary"):
        render_markdown(small, max_chars=100)
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match=rf"max_chars={bad!r}; expected a positive int"):
            render_markdown(small, max_chars=bad)  # type: ignore[arg-type]


def test_deeply_nested_json_is_a_report_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"version": 1, "environment": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
                    encoding="utf-8")
    with pytest.raises(ReportError, match=rf"^{path}: JSON too deeply nested to read"):
        Report.load(path)
    code, text = compare_files(SMALL, path, 0.5)
    assert code == 2 and "deep.json: JSON too deeply nested" in text


# ---- the plugin checks --mxcheck-report and --mxcheck-baseline before any test runs ----


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mxcheck-report", "{tmp}"], "*--mxcheck-report {tmp}: is a directory; give a file path*"),
        (["--mxcheck-report", "{tmp}/no/such/r.json"],
         "*--mxcheck-report {tmp}/no/such/r.json: directory {tmp}/no/such does not exist*"),
        (["--mxcheck-report", "{tmp}/file.txt/r.json"], "*directory {tmp}/file.txt does not exist*"),
        (["--mxcheck-baseline", "{tmp}/missing.json"],
         "*--mxcheck-baseline: {tmp}/missing.json: cannot read report: *No such file*"),
        (["--mxcheck-baseline", "{tmp}/file.txt"],
         "*--mxcheck-baseline: {tmp}/file.txt: not valid JSON*"),
        (["-n", "2", "--mxcheck-baseline", "{tmp}/file.txt"], "*--mxcheck-baseline: *not valid JSON*"),
    ],
    ids=["report-is-a-dir", "report-dir-missing", "report-dir-is-a-file", "baseline-missing",
         "baseline-not-a-report", "baseline-not-a-report-xdist"],
)
def test_bad_report_and_baseline_paths_stop_the_run_before_any_test(
        pytester: pytest.Pytester, args: list[str], message: str) -> None:
    tmp = pytester.path / "out"
    tmp.mkdir()
    (tmp / "file.txt").write_text("not a report", encoding="utf-8")
    ran = pytester.path / "ran"
    pytester.makepyfile(f"def test_body():\n    open({str(ran)!r}, 'w').close()\n")
    result = pytester.runpytest(*(a.replace("{tmp}", str(tmp)) for a in args))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message.replace("{tmp}", str(tmp))])
    assert not ran.exists()  # the test body never ran


def test_a_good_report_path_and_baseline_run_the_tests(pytester: pytest.Pytester) -> None:
    ran = pytester.path / "ran"
    pytester.makepyfile(f"def test_body():\n    open({str(ran)!r}, 'w').close()\n")
    result = pytester.runpytest("--mxcheck-report", "r.json",
                                "--mxcheck-baseline", str(SMALL))
    assert ran.exists() and (pytester.path / "r.json").exists()
    # SMALL's checks are not in this run: they are "not run", listed and no regression.
    result.stdout.fnmatch_lines(["*15 not run*"])
    assert result.ret == pytest.ExitCode.OK
