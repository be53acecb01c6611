"""The report's stored form: one Record per comparison a test makes, a Report of them all.

JSON is the stored form. Non-finite floats are written as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` (plain JSON has no NaN, and an SNR of Inf, a bit-exact result,
is an ordinary value here); ``None`` is ``null``. ``Report.save`` writes sorted records
with sorted keys so the same records give byte-identical files whatever order xdist
workers delivered them in. Keys this version does not know are kept and written back,
so a newer writer's sections survive a merge by an older reader. ``witness_drifts``
(tests xfailed because a witness library newer than its pins answered differently) is
written only when a run saw any, so reports without drift read as before. Likewise
``complete: false`` and ``incomplete_reason`` are written only for a run that did not finish
(a signal, --maxfail, too many crashed workers): a report without them is complete.
``exit_status`` is pytest's, where pytest wrote the report.
"""

from __future__ import annotations

import json
import math
import operator
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mxcheck.recipes import LINEAR_DIRECTIONS

__all__ = [
    "DIRECTIONS",
    "SCHEMA_VERSION",
    "Record",
    "Report",
    "ReportError",
    "decode_float",
    "encode_json",
]

SCHEMA_VERSION = 1
# Logical GEMM order, used for sorting too: a table reads fwd before its backward.
DIRECTIONS = (*LINEAR_DIRECTIONS, "quantize")  # a record's: a linear's, or a quantize check
KINDS = ("snr", "bitwise", "deterministic")  # documented kinds; any other string is allowed

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_FLOAT_FIELDS = ("snr_db", "threshold_db", "cosine", "max_abs_error")
_INT_FIELDS = ("m", "n", "k", "mismatches", "total")
_STR_FIELDS = ("test_id", "backend", "recipe")


class ReportError(ValueError):
    """A report file or record that cannot be read; the message names where and what."""


def encode_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its string, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): encode_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_json(v) for v in value]
    return value


def decode_float(value: Any, name: str) -> float | None:
    """A float field read back from JSON: a number, null, or one of "nan", "inf", "-inf"."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.lower() in _NONFINITE:
            return _NONFINITE[value.lower()]
        raise ValueError(f"{name}={value!r}; expected a number, null, 'nan', 'inf' or '-inf'")
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}; expected a number, not a bool")
    try:
        return float(value)  # also takes numpy scalars and 0-d tensors from callers
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}; expected a number or null") from None


def _as_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}; expected an integer or null")
    try:
        return operator.index(value)  # numpy ints pass; 3.0 does not silently become 3
    except TypeError:
        raise ValueError(f"{name}={value!r}; expected an integer or null") from None


def _as_bool(value: Any, name: str, *, optional: bool) -> bool | None:
    if value is None and optional:
        return None
    if hasattr(value, "item") and not isinstance(value, bool):
        value = value.item()  # numpy.bool_ / 0-d tensor from torch.equal-like helpers
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}; expected true/false{' or null' if optional else ''}")
    return value


@dataclass(kw_only=True)
class Record:
    """One comparison: what was compared, how close it came, and whether it passed."""

    test_id: str
    backend: str
    recipe: str
    layer: str | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    direction: str | None = None  # one of DIRECTIONS, or None
    kind: str = "snr"  # "snr" | "bitwise" | "deterministic" | another string
    snr_db: float | None = None
    threshold_db: float | None = None
    cosine: float | None = None
    max_abs_error: float | None = None
    bit_equal: bool | None = None
    mismatches: int | None = None
    total: int | None = None
    passed: bool
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, Any] = field(default_factory=dict)  # keys from a newer schema, kept

    def __post_init__(self) -> None:
        # Normalise here so a record compares, sorts and serialises the same however made.
        for name in _STR_FIELDS:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)!r}; expected a non-empty string")
        if self.layer is not None and not isinstance(self.layer, str):
            raise ValueError(f"layer={self.layer!r}; expected a string or None")
        if self.direction is not None and self.direction not in DIRECTIONS:
            raise ValueError(f"direction={self.direction!r}; expected one of {DIRECTIONS} or None")
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"kind={self.kind!r}; expected a non-empty string such as {KINDS}")
        if not isinstance(self.message, str):
            raise ValueError(f"message={self.message!r}; expected a string")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra={self.extra!r}; expected a dict")
        for name in _FLOAT_FIELDS:
            setattr(self, name, decode_float(getattr(self, name), name))
        for name in _INT_FIELDS:
            setattr(self, name, _as_int(getattr(self, name), name))
        self.bit_equal = _as_bool(self.bit_equal, "bit_equal", optional=True)
        self.passed = _as_bool(self.passed, "passed", optional=False)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """(test_id, layer, direction, backend, recipe): what a comparison matches on."""
        return (self.test_id, self.layer or "", self.direction or "", self.backend, self.recipe)

    def sort_key(self) -> tuple:
        """A total order: the key (directions in GEMM order), then kind, then the content."""
        direction = DIRECTIONS.index(self.direction) if self.direction else -1
        # The serialised record breaks ties, so even duplicate keys land in one order.
        content = json.dumps(self.to_json(), sort_keys=True)
        return (self.test_id, self.layer or "", direction, self.backend, self.recipe,
                self.kind, content)

    @property
    def margin_db(self) -> float | None:
        """SNR minus threshold (positive is headroom); None without both numbers."""
        if self.snr_db is None or self.threshold_db is None:
            return None
        return self.snr_db - self.threshold_db

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite floats as strings); unknown keys are written back."""
        out = dict(self.unknown)
        for f in fields(self):
            if f.name != "unknown":
                out[f.name] = getattr(self, f.name)
        return encode_json(out)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """The inverse of ``to_json``; raises ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a record must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)} - {"unknown"}
        missing = [n for n in ("test_id", "backend", "recipe", "passed") if n not in data]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        kwargs = {k: v for k, v in data.items() if k in known}
        unknown = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, unknown=unknown)


def _check_skipped(items: Any, name: str = "skipped") -> list[dict[str, str]]:
    if not isinstance(items, list):
        raise ValueError(f"{name} must be a list, got {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        if not (isinstance(item, dict) and isinstance(item.get("test_id"), str)
                and isinstance(item.get("reason"), str)):
            raise ValueError(f"{name}[{i}]={item!r}; expected {{'test_id': str, 'reason': str}}")
        out.append(dict(item))
    return out


def _merge_values(values: list[Any]) -> Any:
    """One value if all agree, else the distinct values in a fixed (JSON text) order."""
    distinct = {json.dumps(encode_json(v), sort_keys=True): v for v in values}
    if len(distinct) == 1:
        return values[0]
    return [distinct[t] for t in sorted(distinct)]


@dataclass
class Report:
    """Records and skips of one run, with the environment that produced them."""

    environment: dict[str, Any] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"test_id", "reason"}
    version: int = SCHEMA_VERSION
    unknown: dict[str, Any] = field(default_factory=dict)  # top-level keys from a newer writer
    witness_drifts: list[dict[str, str]] = field(default_factory=list)  # {"test_id", "reason"}
    # Did the run finish? A run ended by a signal, --maxfail or a crash limit did not, and
    # its report cannot serve as a baseline (a missing check would read as never run).
    complete: bool = True
    incomplete_reason: str = ""  # why not complete, e.g. "SIGTERM after 40 of 235 tests"
    exit_status: int | None = None  # pytest's exit status, where pytest wrote the report

    def __post_init__(self) -> None:
        self.complete = _as_bool(self.complete, "complete", optional=False)
        if not isinstance(self.incomplete_reason, str):
            raise ValueError(f"incomplete_reason={self.incomplete_reason!r}; expected a string")
        self.exit_status = _as_int(self.exit_status, "exit_status")

    @classmethod
    def merge(cls, reports: list[Report]) -> Report:
        """One report from many (xdist workers); the result does not depend on their order.

        Environment (and unknown top-level) keys that disagree become a sorted list of the
        distinct values, so a mixed-device run says so instead of keeping whichever came first.
        """
        reports = list(reports)
        versions = {r.version for r in reports}
        if len(versions) > 1:
            raise ValueError(f"cannot merge reports of versions {sorted(versions)}")
        return cls(
            environment=_merge_dicts([r.environment for r in reports]),
            records=sorted((rec for r in reports for rec in r.records), key=Record.sort_key),
            skipped=sorted((s for r in reports for s in r.skipped), key=_skip_key),
            witness_drifts=sorted((d for r in reports for d in r.witness_drifts), key=_skip_key),
            version=versions.pop() if versions else SCHEMA_VERSION,
            unknown=_merge_dicts([r.unknown for r in reports]),
            complete=all(r.complete for r in reports),
            incomplete_reason="; ".join(sorted({r.incomplete_reason for r in reports
                                                if r.incomplete_reason})),
            exit_status=max((r.exit_status for r in reports if r.exit_status is not None),
                            default=None),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with records and skips in their canonical order."""
        out = encode_json(dict(self.unknown))
        out.update(
            version=self.version,
            environment=encode_json(self.environment),
            records=[r.to_json() for r in sorted(self.records, key=Record.sort_key)],
            skipped=sorted(_check_skipped(self.skipped), key=_skip_key),
        )
        if not self.complete:
            out.update(complete=False, incomplete_reason=self.incomplete_reason)
        if self.exit_status is not None:
            out["exit_status"] = self.exit_status
        if self.witness_drifts:
            out["witness_drifts"] = sorted(_check_skipped(self.witness_drifts, "witness_drifts"), key=_skip_key)
        return out

    @classmethod
    def from_json(cls, data: Any) -> Report:
        """The inverse of ``to_json``; raises ValueError naming the bad part."""
        if not isinstance(data, dict):
            raise ValueError(f"top level must be a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if isinstance(version, bool) or version != SCHEMA_VERSION:  # True == 1 in Python
            raise ValueError(
                f"version={version!r}; this mxcheck reads version {SCHEMA_VERSION}: "
                "regenerate the report with this mxcheck, or upgrade mxcheck to read it"
            )
        env = data.get("environment", {})
        if not isinstance(env, dict):
            raise ValueError(f"environment must be a JSON object, got {type(env).__name__}")
        raw = data.get("records", [])
        if not isinstance(raw, list):
            raise ValueError(f"records must be a list, got {type(raw).__name__}")
        records = []
        for i, item in enumerate(raw):
            try:
                records.append(Record.from_json(item))
            except (TypeError, ValueError) as e:
                raise ValueError(f"records[{i}]: {e}") from None
        known = ("version", "environment", "records", "skipped", "witness_drifts", "complete",
                 "incomplete_reason", "exit_status")
        # A report written before "complete" existed came from a run that finished writing.
        return cls(environment=env, records=records, complete=data.get("complete", True),
                   incomplete_reason=data.get("incomplete_reason", ""),
                   exit_status=data.get("exit_status"),
                   skipped=_check_skipped(data.get("skipped", [])),
                   witness_drifts=_check_skipped(data.get("witness_drifts", []), "witness_drifts"),
                   unknown={k: v for k, v in data.items() if k not in known})

    def dumps(self) -> str:
        """The canonical JSON text: sorted records and keys, indent 1, trailing newline."""
        return json.dumps(self.to_json(), sort_keys=True, indent=1, allow_nan=False,
                          ensure_ascii=False) + "\n"

    @classmethod
    def loads(cls, text: str, source: str = "<string>") -> Report:
        """Parse JSON text; errors are ReportError naming ``source`` and the problem."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportError(f"{source}: not valid JSON: {e.msg} at line {e.lineno} "
                              f"column {e.colno}") from None
        except RecursionError:  # json's decoder recurses once per level of [ or {
            raise ReportError(f"{source}: JSON too deeply nested to read (Python's recursion "
                              "limit); a report is a few levels deep") from None
        try:
            return cls.from_json(data)
        except ValueError as e:
            raise ReportError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the canonical JSON; written beside ``path`` and renamed, so never half a file."""
        path = Path(path)
        text = self.dumps()
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())  # the rename must not land before the bytes do
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read a report file; a missing, unreadable or invalid file is a ReportError."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ReportError(f"{path}: cannot read report: {e}") from None
        return cls.loads(text, source=str(path))


def _skip_key(item: dict[str, str]) -> tuple[str, str]:
    return (item["test_id"], item["reason"])


def _merge_dicts(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    keys = sorted({k for d in dicts for k in d})
    return {k: _merge_values([d[k] for d in dicts if k in d]) for k in keys}
