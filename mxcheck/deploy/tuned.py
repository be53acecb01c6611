"""Tuned-GEMM coverage of a Flux model in an AITER tuned CSV, and an audit of AITER's log.

``tuned_coverage`` looks up every forward, dgrad and wgrad GEMM of the model's replaced
linears the way AITER's ``get_GEMM_config`` does (research/primus_stack.md 4.3): key
``(gfx, cu_num, M, N, K)`` (``(cu_num, M, N, K)`` for an older CSV without ``gfx``), first
at M itself, then at ``get_padded_m(M, N, K, gl)`` for gl 0 and 1. N and K are never padded.

``audit_log`` counts the hits and misses AITER logs per shape. A hit is logged only with
``AITER_LOG_TUNED_CONFIG=1``; a miss always is.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mxcheck.flux import flux_linear_shapes, unique_gemms
from mxcheck.text import table

__all__ = [
    "REQUIRED_COLUMNS",
    "STATUSES",
    "Coverage",
    "CoverageRow",
    "LogAudit",
    "LogShape",
    "TunedRow",
    "TunedTable",
    "aiter_padded_m",
    "audit_log",
    "read_tuned_csv",
    "tuned_coverage",
]

REQUIRED_COLUMNS = ("cu_num", "M", "N", "K", "kernelName", "splitK")
STATUSES = ("covered", "padded", "missing")


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def aiter_padded_m(m: int, n: int, k: int, gl: int) -> int:
    """AITER's ``getPaddedM(M, N, K, gl)`` (module_gemm_common, ROCm/aiter main as read from
    the code index; primus_stack.md does not give it): gl 0 rounds M up to 16/32/64/128 by
    size (a power of two below 16); gl 1 is the next power of two, except 8192 when
    M > 8192 and N > 4096. K is unused, as there."""
    if gl == 0:
        if 0 < m < 16:
            return _next_pow2(m)
        step = 16 if m <= 256 else 32 if m <= 1024 else 64 if m <= 4096 else 128
        return (m + step - 1) // step * step
    if gl == 1:
        return 8192 if m > 8192 and n > 4096 else _next_pow2(m)
    raise ValueError(f"gl={gl!r}: expected 0 or 1")


# ---- the tuned CSV -------------------------------------------------------------------


@dataclass(frozen=True)
class TunedRow:
    gfx: str | None
    cu_num: int
    m: int
    n: int
    k: int
    kernel: str
    split_k: int
    us: float | None


@dataclass(frozen=True)
class TunedTable:
    rows: tuple[TunedRow, ...]
    has_gfx: bool
    source: str = "<csv>"

    def index(self, cu_num: int, gfx: str) -> dict[tuple[int, int, int], TunedRow]:
        """(M, N, K) -> row for this machine; the first row wins, as a dict built in order."""
        out: dict[tuple[int, int, int], TunedRow] = {}
        for r in self.rows:
            if r.cu_num == cu_num and (not self.has_gfx or r.gfx == gfx):
                out.setdefault((r.m, r.n, r.k), r)
        return out


def _int(value: str | None, column: str, line: int, source: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"tuned CSV {source} line {line}: column {column}={value!r} is not an "
                         "integer") from None


def read_tuned_csv(text: str, *, source: str = "<csv>") -> TunedTable:
    """Parse an AITER tuned GEMM CSV; ValueError naming the file, line and column."""
    reader = csv.DictReader(io.StringIO(text))
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"tuned CSV {source}: missing column(s) {', '.join(missing)}; "
                         f"expected gfx,cu_num,M,N,K,kernelId,splitK,us,kernelName,... "
                         f"(got {','.join(columns) or 'no header'})")
    reader.fieldnames = columns
    rows = []
    for line, rec in enumerate(reader, 2):
        us = (rec.get("us") or "").strip()
        try:
            us_value = float(us) if us else None
        except ValueError:
            us_value = None  # a failed tuning writes text here; the row still keys a lookup
        rows.append(TunedRow(
            gfx=(rec.get("gfx") or "").strip() or None,
            cu_num=_int(rec["cu_num"], "cu_num", line, source),
            m=_int(rec["M"], "M", line, source), n=_int(rec["N"], "N", line, source),
            k=_int(rec["K"], "K", line, source), kernel=(rec["kernelName"] or "").strip(),
            split_k=_int(rec["splitK"], "splitK", line, source), us=us_value))
    return TunedTable(tuple(rows), "gfx" in columns, source)


# ---- coverage ------------------------------------------------------------------------


@dataclass(frozen=True)
class CoverageRow:
    direction: str
    m: int
    n: int
    k: int
    layers: tuple[str, ...]
    status: str            # covered | padded | missing
    tuned_m: int | None    # the M of the row that matched
    kernel: str | None

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "M": self.m, "N": self.n, "K": self.k,
                "status": self.status, "tuned_M": self.tuned_m, "kernel": self.kernel,
                "layers": list(self.layers)}


@dataclass(frozen=True)
class Coverage:
    rows: tuple[CoverageRow, ...]
    model: str
    mbs: int
    img_tokens: int
    txt_tokens: int
    cu_num: int
    gfx: str
    table: TunedTable

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 1 if self.count("missing") else 0

    def to_json(self) -> dict[str, Any]:
        return {"csv": self.table.source, "model": self.model, "mbs": self.mbs,
                "img_tokens": self.img_tokens, "txt_tokens": self.txt_tokens,
                "cu_num": self.cu_num, "gfx": self.gfx if self.table.has_gfx else None,
                "counts": {s: self.count(s) for s in STATUSES},
                "shapes": [r.to_json() for r in self.rows]}

    def to_text(self) -> str:
        where = f"cu_num {self.cu_num}" + (f", {self.gfx}" if self.table.has_gfx else
                                           " (no gfx column: matched on cu_num only)")
        head = (f"{self.table.source}: {self.model} mbs {self.mbs}, {self.img_tokens} image + "
                f"{self.txt_tokens} text tokens, {where}: "
                + ", ".join(f"{self.count(s)} {s}" for s in STATUSES))
        rows = [("status", "dir", "M", "N", "K", "tuned M", "layers")]
        for r in sorted(self.rows, key=lambda r: (STATUSES.index(r.status), r.direction)):
            more = f" (+{len(r.layers) - 1})" if len(r.layers) > 1 else ""
            rows.append((r.status, r.direction, str(r.m), str(r.n), str(r.k),
                         "-" if r.tuned_m is None else str(r.tuned_m), r.layers[0] + more))
        return f"{head}\n{table(rows)}"


def _lookup(index: dict[tuple[int, int, int], TunedRow], m: int, n: int,
            k: int) -> tuple[TunedRow | None, int]:
    for padded in (m, aiter_padded_m(m, n, k, 0), aiter_padded_m(m, n, k, 1)):
        if (padded, n, k) in index:
            return index[(padded, n, k)], padded
    return None, m


def tuned_coverage(table: TunedTable, model: str, mbs: int, *, img_tokens: int = 256,
                   txt_tokens: int = 256, cu_num: int = 256, gfx: str = "gfx950") -> Coverage:
    """Every replaced-linear GEMM of ``model`` at this batch: covered, padded or missing."""
    if not isinstance(table, TunedTable):
        raise TypeError(f"table={table!r}: expected a TunedTable (see read_tuned_csv)")
    if isinstance(cu_num, bool) or not isinstance(cu_num, int) or cu_num < 1:
        raise ValueError(f"cu_num={cu_num!r}: expected a positive int (MI355X: 256)")
    gemms = unique_gemms(flux_linear_shapes(model, mbs, img_tokens, txt_tokens))
    index = table.index(cu_num, gfx)
    rows = []
    for (direction, m, n, k), layers in gemms.items():
        row, tuned_m = _lookup(index, m, n, k)
        status = "missing" if row is None else "covered" if tuned_m == m else "padded"
        rows.append(CoverageRow(direction, m, n, k, tuple(layers), status,
                                None if row is None else tuned_m,
                                None if row is None else row.kernel))
    return Coverage(tuple(rows), model, mbs, img_tokens, txt_tokens, cu_num, gfx, table)


# ---- the log -------------------------------------------------------------------------

_MNK = r"M:\s*(?P<m>\d+),?\s*N:\s*(?P<n>\d+),?\s*K:\s*(?P<k>\d+)"
# aiter/ops/gemm_op_a4w4.py (hit only with AITER_LOG_TUNED_CONFIG=1; miss always), and the
# A6W6 lines of branch mxfp6-gemms-clean (research/primus_stack.md 2.2, 4.3).
_PATTERNS = (
    ("a4w4", "hit", re.compile(rf"shape is {_MNK}, found padded_M: (?P<tm>\d+), .*?"
                               r"kernel name is (?P<kernel>\S+?), splitK is")),
    ("a4w4", "miss", re.compile(rf"shape is {_MNK}, not found tuned config in")),
    ("a6w6", "hit", re.compile(rf"A6W6 shape {_MNK} matched \S+ config M:\s*(?P<tm>\d+)"
                               r".*: (?P<kernel>\S+)\s*$")),
    ("a6w6", "miss", re.compile(rf"A6W6 shape {_MNK} has no tuned config")),
)


@dataclass
class LogShape:
    kind: str
    m: int
    n: int
    k: int
    hits: int = 0
    misses: int = 0
    tuned_m: set[int] = field(default_factory=set)
    kernels: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "M": self.m, "N": self.n, "K": self.k, "hits": self.hits,
                "misses": self.misses, "padded": any(t != self.m for t in self.tuned_m),
                "tuned_M": sorted(self.tuned_m), "kernels": sorted(self.kernels)}


@dataclass(frozen=True)
class LogAudit:
    shapes: tuple[LogShape, ...]
    lines_read: int
    source: str = "<log>"

    @property
    def hits(self) -> int:
        return sum(s.hits for s in self.shapes)

    @property
    def misses(self) -> int:
        return sum(s.misses for s in self.shapes)

    @property
    def exit_code(self) -> int:
        return 1 if self.misses else 0

    def to_json(self) -> dict[str, Any]:
        return {"log": self.source, "lines_read": self.lines_read, "hits": self.hits,
                "misses": self.misses, "shapes": [s.to_json() for s in self.shapes]}

    def to_text(self) -> str:
        head = (f"{self.source}: {self.hits} tuned-config hit(s), {self.misses} miss(es) over "
                f"{len(self.shapes)} shape(s) in {self.lines_read} lines")
        if not self.shapes:
            return (head + "\n  no AITER tuned-config lines found; hits are logged only with "
                    "AITER_LOG_TUNED_CONFIG=1\n")
        rows = [f"  {'MISS' if s.misses else 'ok':<4}  {s.kind}  M={s.m} N={s.n} K={s.k}  "
                f"hits {s.hits}  misses {s.misses}"
                + (f"  padded to M={','.join(map(str, sorted(s.tuned_m)))}"
                   if any(t != s.m for t in s.tuned_m) else "")
                for s in self.shapes]
        return "\n".join([head, *rows]) + "\n"


def audit_log(lines: Iterable[str], *, source: str = "<log>") -> LogAudit:
    """Hits and misses per (kind, M, N, K), in first-seen order; other lines are ignored."""
    shapes: dict[tuple[str, int, int, int], LogShape] = {}
    count = 0
    for line in lines:
        count += 1
        for kind, outcome, pattern in _PATTERNS:
            m = pattern.search(line)
            if m is None:
                continue
            key = (kind, int(m["m"]), int(m["n"]), int(m["k"]))
            shape = shapes.setdefault(key, LogShape(*key))
            if outcome == "hit":
                shape.hits += 1
                shape.tuned_m.add(int(m["tm"]))
                shape.kernels.add(m["kernel"].rstrip("!,"))
            else:
                shape.misses += 1
            break
    return LogAudit(tuple(shapes.values()), count, source)
