"""``mxcheck tuned-coverage`` and ``mxcheck aiter-log`` on the fixtures in fixtures/aiter/.

a4w4_flux12b_mbs64.csv was written for Flux 12B at micro batch 64 (256 + 256 tokens):
13 GEMMs tuned at their own M; fwd linear1 (32768x21504x3072) only at M = 8192 (getPaddedM
gl 1: M > 8192 and N > 4096); wgrad qkv (9216x3072x16384) only at M = 16384 (gl 1: next
power of two); 3 GEMMs missing, one of them tuned only for cu_num 80 and one only on gfx942.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mxcheck.deploy import Coverage, aiter_padded_m, audit_log, read_tuned_csv, tuned_coverage
from mxcheck.flux import flux_linear_shapes, unique_gemms
from tests._helpers import run_cli

pytestmark = pytest.mark.emulated

AITER = Path(__file__).parents[1] / "fixtures" / "aiter"
CSV = AITER / "a4w4_flux12b_mbs64.csv"
OLD_CSV = AITER / "a4w4_old_no_gfx.csv"
LOG = AITER / "flux12b_mxfp4_train.log"


def coverage_of(path: Path, **kw: Any) -> Coverage:
    table = read_tuned_csv(path.read_text(), source=path.name)
    return tuned_coverage(table, "flux-12b", 64, **kw)


# (M, N, K, gl) -> padded M, by hand from AITER's getPaddedM.
@pytest.mark.parametrize(("m", "n", "k", "gl", "padded"), [
    (5, 3072, 3072, 0, 8), (100, 3072, 3072, 0, 112), (256, 3072, 3072, 0, 256),
    (300, 3072, 3072, 0, 320), (2000, 3072, 3072, 0, 2048), (5000, 3072, 3072, 0, 5120),
    (9216, 3072, 16384, 1, 16384), (16384, 9216, 3072, 1, 8192), (16384, 3072, 3072, 1, 16384),
    (3000, 9216, 3072, 1, 4096),
])
def test_padded_m_follows_aiter(m: int, n: int, k: int, gl: int, padded: int) -> None:
    assert aiter_padded_m(m, n, k, gl) == padded


def test_padded_m_rejects_an_unknown_granularity() -> None:
    with pytest.raises(ValueError, match="gl=2"):
        aiter_padded_m(16, 16, 16, 2)


def test_coverage_sorts_every_gemm_into_covered_padded_missing() -> None:
    cov = coverage_of(CSV)
    status = {(r.direction, r.m, r.n, r.k): (r.status, r.tuned_m) for r in cov.rows}
    assert len(status) == 18
    assert status[("fwd", 16384, 9216, 3072)] == ("covered", 16384)
    assert status[("fwd", 32768, 21504, 3072)] == ("padded", 8192)
    assert status[("wgrad", 9216, 3072, 16384)] == ("padded", 16384)
    missing = sorted(k for k, (s, _) in status.items() if s == "missing")
    assert missing == [("dgrad", 32768, 15360, 3072), ("wgrad", 3072, 15360, 32768),
                       ("wgrad", 21504, 3072, 32768)]
    assert (cov.count("covered"), cov.count("padded"), cov.count("missing")) == (13, 2, 3)
    assert cov.exit_code == 1


def test_rows_for_another_machine_do_not_count() -> None:
    # The cu_num 80 row and the gfx942 row match when asked for those machines.
    cu80 = {(r.direction, r.m): r.status for r in coverage_of(CSV, cu_num=80).rows}
    assert cu80[("wgrad", 21504)] == "covered" and cu80[("fwd", 16384)] == "missing"
    gfx942 = {(r.direction, r.m, r.n): r.status for r in coverage_of(CSV, gfx="gfx942").rows}
    assert gfx942[("dgrad", 32768, 15360)] == "covered"


def test_a_csv_without_gfx_matches_on_cu_num_only() -> None:
    cov = coverage_of(OLD_CSV, gfx="gfx942")
    assert not cov.table.has_gfx
    assert (cov.count("covered"), cov.count("padded"), cov.count("missing")) == (1, 1, 16)
    assert "no gfx column" in cov.to_text()


def test_a_csv_tuned_for_every_shape_covers_all() -> None:
    gemms = unique_gemms(flux_linear_shapes("flux-12b", 2, 256, 256))
    lines = ["gfx,cu_num,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio"]
    lines += [f"gfx950,256,{m},{n},{k},1,0,1.0,kern,1,1,0" for (_, m, n, k) in gemms]
    cov = tuned_coverage(read_tuned_csv("\n".join(lines)), "flux-12b", 2)
    assert cov.count("covered") == len(gemms) and cov.exit_code == 0


@pytest.mark.parametrize(("text", "needle"), [
    ("gfx,M,N,K,kernelName,splitK\n", "missing column(s) cu_num"),
    ("cu_num,M,N,K,kernelName,splitK\n256,16384,x,3072,k,0\n", "line 2: column N='x'"),
    ("", "missing column(s)"),
])
def test_a_bad_csv_names_the_problem(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=r"tuned CSV t\.csv") as e:
        read_tuned_csv(text, source="t.csv")
    assert needle in str(e.value)


def test_coverage_rejects_bad_arguments() -> None:
    table = read_tuned_csv(CSV.read_text())
    with pytest.raises(ValueError, match="cu_num=0"):
        tuned_coverage(table, "flux-12b", 64, cu_num=0)
    with pytest.raises(ValueError, match="flux-13b"):
        tuned_coverage(table, "flux-13b", 64)
    with pytest.raises(TypeError, match="table="):
        tuned_coverage(CSV, "flux-12b", 64)  # type: ignore[arg-type]


# ---- the log -------------------------------------------------------------------------


def test_log_audit_counts_hits_and_misses_per_shape() -> None:
    audit = audit_log(LOG.read_text().splitlines(), source="train.log")
    shapes = {(s.kind, s.m, s.n, s.k): (s.hits, s.misses) for s in audit.shapes}
    assert shapes == {("a4w4", 16384, 9216, 3072): (2, 0), ("a4w4", 32768, 21504, 3072): (1, 0),
                      ("a4w4", 21504, 3072, 32768): (0, 2), ("a6w6", 16384, 3072, 3072): (1, 0),
                      ("a6w6", 256, 3072, 3072): (0, 1)}
    assert (audit.hits, audit.misses, audit.lines_read, audit.exit_code) == (4, 3, 10, 1)


def test_log_audit_marks_a_hit_found_at_a_padded_m() -> None:
    data = audit_log(LOG.read_text().splitlines()).to_json()
    padded = [(s["M"], s["tuned_M"]) for s in data["shapes"] if s["padded"]]
    assert padded == [(32768, [8192])]
    (qkv,) = [s for s in data["shapes"] if (s["M"], s["N"]) == (16384, 9216)]
    assert qkv["kernels"] == ["_ZN5aiter41f4gemm_bf16_per1x32Fp4_BpreShuffle_256x256E"]


def test_a_log_without_aiter_lines_says_hits_need_the_env_var() -> None:
    audit = audit_log(["iteration 1 | loss 0.5", "iteration 2 | loss 0.4"])
    assert (audit.shapes, audit.lines_read, audit.exit_code) == ((), 2, 0)
    assert "AITER_LOG_TUNED_CONFIG=1" in audit.to_text()


# ---- the commands --------------------------------------------------------------------


def test_cli_tuned_coverage_json_and_exit_1_on_missing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "tuned-coverage", CSV, "--model", "flux-12b", "--mbs", "64",
                         "--json")
    data = json.loads(out)
    assert (code, err) == (1, "")
    assert data["counts"] == {"covered": 13, "padded": 2, "missing": 3}
    assert (data["cu_num"], data["gfx"], data["mbs"]) == (256, "gfx950", 64)
    row = next(r for r in data["shapes"] if r["status"] == "padded" and r["direction"] == "fwd")
    assert (row["M"], row["tuned_M"], row["layers"][0]) == (32768, 8192,
                                                           "single_blocks.0.linear1")


def test_cli_tuned_coverage_text_and_exit_0_when_covered(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "tuned-coverage", CSV, "--mbs", "64")
    assert code == 1 and "13 covered, 2 padded, 3 missing" in out.splitlines()[0]
    gemms = unique_gemms(flux_linear_shapes("flux-535m", 1, 64, 32))
    full = tmp_path / "full.csv"
    full.write_text("cu_num,M,N,K,kernelName,splitK\n"
                    + "".join(f"304,{m},{n},{k},kern,0\n" for (_, m, n, k) in gemms))
    code, out, _ = run_cli(capsys, "tuned-coverage", full, "--model", "flux-535m", "--mbs", "1",
                       "--img-tokens", "64", "--txt-tokens", "32", "--cu-num", "304")
    assert code == 0 and f"{len(gemms)} covered, 0 padded, 0 missing" in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["tuned-coverage", AITER / "none.csv", "--mbs", "64"], "cannot read tuned CSV"),
    (["tuned-coverage", CSV], "--mbs"),
    (["tuned-coverage", CSV, "--mbs", "0"], "mbs must be a positive integer"),
    (["tuned-coverage", CSV, "--mbs", "64", "--model", "flux-13b"], "flux-13b"),
    (["tuned-coverage", LOG, "--mbs", "64"], "missing column(s)"),
    (["aiter-log", AITER / "none.log"], "cannot read log"),
])
def test_cli_bad_usage_or_input_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                                        argv: list[str | Path],
                                                        needle: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "error: " in err and needle in err


def test_cli_aiter_log_json_and_exit_codes(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "aiter-log", LOG, "--json")
    data = json.loads(out)
    assert (code, data["hits"], data["misses"], len(data["shapes"])) == (1, 4, 3, 5)
    hits_only = tmp_path / "hits.log"
    hits_only.write_text("\n".join(line for line in LOG.read_text().splitlines()
                                   if "not found" not in line and "no tuned" not in line))
    code, out, _ = run_cli(capsys, "aiter-log", hits_only)
    assert code == 0 and "4 tuned-config hit(s), 0 miss(es)" in out
