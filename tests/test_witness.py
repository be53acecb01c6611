"""tests/_witness.py: a witness's pinned answer by its version; drift outside the observed
versions xfails (counted by the plugin, tests/test_plugin.py), a mismatch inside fails."""

from __future__ import annotations

import pytest
from packaging.version import Version

from mxcheck.plugin import WITNESS_DRIFT
from tests import _witness
from tests._witness import Witnesses

pytestmark = pytest.mark.emulated

PIN = {"<0.7": 0x01, ">=0.7": 0x00}  # ml_dtypes' e8m0 cast of float32 1.25 * 2^-127


@pytest.fixture
def ml_dtypes_at(monkeypatch: pytest.MonkeyPatch):
    def at(version: str) -> None:
        real = _witness.installed
        monkeypatch.setattr(_witness, "installed",
                            lambda w: Version(version) if w == "ml_dtypes" else real(w))
    return at


@pytest.mark.parametrize(("version", "got"), [("0.6.0", 0x01), ("0.6.9", 0x01), ("0.7.0", 0x00)])
def test_a_version_inside_the_observed_span_giving_its_pin_passes(ml_dtypes_at, version, got):
    ml_dtypes_at(version)
    w = Witnesses()
    w.expect("ml_dtypes", got, PIN, "x")
    w.finish()
    assert w.drifts == []


@pytest.mark.parametrize(("version", "got", "range_"), [("0.6.0", 0x00, "<0.7"), ("0.7.0", 0x01, ">=0.7")])
def test_a_version_inside_the_observed_span_must_give_its_range_pin(ml_dtypes_at, version, got, range_):
    ml_dtypes_at(version)
    want = 0x01 if range_ == "<0.7" else 0x00
    with pytest.raises(AssertionError, match=rf"^ml_dtypes {version} gives 0x0{got} for x; pinned 0x0{want} "
                                             rf"for ml_dtypes{range_} \(observed on 0\.6\.0, 0\.7\.0\)$"):
        Witnesses().expect("ml_dtypes", got, PIN, "x")


def test_a_newer_version_that_disagrees_xfails_naming_version_answer_and_pin(ml_dtypes_at):
    ml_dtypes_at("0.8.0")
    w = Witnesses()
    w.expect("ml_dtypes", 0x01, PIN, "the e8m0 cast of float32 1.25*2^-127")
    w.expect("ml_dtypes", 0x7F, 0x7F, "the e8m0 cast of 1.0")  # agrees: no drift
    w.expect("ml_dtypes", 0x7E, 0x7F, "the e8m0 cast of 1.25")
    with pytest.raises(pytest.xfail.Exception) as e:
        w.finish()
    assert e.value.msg == (f"{WITNESS_DRIFT} ml_dtypes 0.8.0 gives 0x01 for the e8m0 cast of float32 "
                           "1.25*2^-127; pinned 0x00 for ml_dtypes>=0.7 (observed on 0.6.0, 0.7.0); "
                           "ml_dtypes 0.8.0 gives 0x7E for the e8m0 cast of 1.25; pinned 0x7F "
                           "(observed on 0.6.0, 0.7.0)")


def test_a_newer_version_that_agrees_passes(ml_dtypes_at):
    ml_dtypes_at("0.8.0")
    w = Witnesses()
    w.expect("ml_dtypes", 0x00, PIN, "x")
    w.expect("ml_dtypes", (0x7F, 0xFF), (0x7F, 0xFF), "y")
    w.finish()


def test_an_older_version_below_every_range_is_drift_against_the_newest_pin(ml_dtypes_at):
    ml_dtypes_at("0.5.1")
    w = Witnesses()
    w.expect("ml_dtypes", 0x02, {">=0.5,<0.7": 0x01, ">=0.7": 0x00}, "x")
    w.expect("ml_dtypes", 0x02, {"<0.7": 0x01, ">=0.7": 0x00}, "y")
    assert w.drifts == ["ml_dtypes 0.5.1 gives 0x02 for x; pinned 0x01 for ml_dtypes>=0.5,<0.7 "
                        "(observed on 0.6.0, 0.7.0)",
                        "ml_dtypes 0.5.1 gives 0x02 for y; pinned 0x01 for ml_dtypes<0.7 (observed on 0.6.0, 0.7.0)"]


@pytest.mark.parametrize(("pin", "error", "match"), [
    ({">=0.7": 0x00}, AssertionError, r"has no range holding ml_dtypes 0\.6\.0 \(x\)"),
    ({"<0.7": 0x01, ">=0.6.5": 0x00}, ValueError, r"ranges \['<0\.7', '>=0\.6\.5'\] overlap at 0\.6\.9"),
])
def test_a_pin_must_hold_every_observed_version_exactly_once(ml_dtypes_at, pin, error, match):
    ml_dtypes_at("0.6.9")
    with pytest.raises(error, match=match):
        Witnesses().expect("ml_dtypes", 0x00, pin, "x")


def test_installed_versions_drop_the_local_part_and_unknown_witnesses_raise():
    assert _witness.installed("torch").local is None
    assert _witness.installed("torch") == Version(Version(pytest.importorskip("torch").__version__).public)
    with pytest.raises(ValueError, match=r"witness='jax'; expected one of \['gfloat', 'ml_dtypes', 'numpy'"):
        _witness.installed("jax")


@pytest.mark.parametrize(("value", "text"), [(0x7F, "0x7F"), (0x3F81, "0x3F81"), ((0x7F, 0xFF), "(0x7F, 0xFF)"),
                                             (None, "None"), (True, "True")])
def test_answers_show_in_hex_as_the_tables_write_them(value, text):
    assert _witness.show(value) == text
