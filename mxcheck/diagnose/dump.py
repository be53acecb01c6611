"""Every differing block of every failing quantize comparison, on disk, loaded with one call.

The terminal and the report keep their summary (a few comparisons in full, the rest on one
line); ``--mxcheck-dump DIR`` (pytest) and ``mxcheck conform --dump DIR`` also write each
failing comparison to ``DIR`` as one ``.pt`` file: its input rows holding differing blocks,
the oracle's and the kernel's tensors on those rows, per block which fields differ, which
blocks the attribution examined and explained, the attribution lines and the fit.
``load_dump(DIR)`` returns them all, as dicts, in the order they were written.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from mxcheck.diagnose.behaviour import render_attributions

__all__ = ["DUMP_ENV", "dump_dir", "load_dump", "write_dump"]

DUMP_ENV = "MXCHECK_DUMP_DIR"  # set by --mxcheck-dump; read where a check fails (xdist workers inherit it)


def dump_dir() -> Path | None:
    """The directory failing comparisons are written to, or None (no dump asked for)."""
    d = os.environ.get(DUMP_ENV)
    return Path(d) if d else None


def _tensors(q: Any, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """q's tensor fields, those with one entry per row restricted to ``rows``."""
    n = q.codes.shape[0] if q.codes.ndim else 0
    out = {}
    for f in q.__dataclass_fields__:
        t = getattr(q, f)
        if isinstance(t, torch.Tensor):
            out[f] = t[rows].clone() if t.ndim and n and t.shape[0] == n else t.clone()
    return out


def _name(check: str, index: int, d: Any) -> str:
    text = f"{check}-{index:03d}-{d.operand}-{d.label}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") + ".pt"


def write_dump(directory: str | Path, diffs: list[Any], check: str) -> list[Path]:
    """One file per comparison of ``diffs`` (``quantize.QuantizeDiff``) that has differing
    blocks; returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, d in enumerate(diffs):
        if d.differing is None or not d.n_differing:
            continue
        per_row = d.n_blocks // d.oracle.codes.shape[0] if d.oracle.codes.ndim == 2 else d.n_blocks
        blocks = d.differing.nonzero().flatten()
        rows = torch.unique(blocks // per_row) if d.oracle.codes.ndim == 2 else torch.arange(1)
        record = {
            "check": check, "operand": d.operand, "label": d.label, "spec": asdict(d.spec),
            "rows": rows, "blocks": blocks, "blocks_per_row": per_row,
            "input": d.x[rows].clone() if d.x.ndim == 2 and d.oracle.codes.ndim == 2 else d.x.clone(),
            "oracle": _tensors(d.oracle, rows), "kernel": _tensors(d.kernel, rows),
            "fields_differ": {"+".join(kind): mask[blocks].clone() for kind, mask in d.kinds.items()},
            "examined": None if d.examined is None else d.examined[blocks].clone(),
            "explained": None if d.explained is None else d.explained[blocks].clone(),
            "attribution": render_attributions(d.attributions, d.n_examined, d.unexplained, d.unit),
            "fit": None if d.fit is None else d.fit.text(f"{d.operand} ({d.label})"),
        }
        path = directory / _name(check, i, d)
        torch.save(record, path)
        paths.append(path)
    return paths


def load_dump(directory: str | Path) -> list[dict[str, Any]]:
    """Every comparison written to ``directory`` (``write_dump``), oldest first. Each dict:
    ``check``, ``operand``, ``label``, ``spec``; ``rows`` (the input rows kept), ``blocks``
    (the differing blocks' indices), ``input`` (those rows), ``oracle`` and ``kernel`` (their
    tensor fields on those rows), ``fields_differ`` (per differing block, which fields),
    ``examined``/``explained`` (per differing block), ``attribution`` (its lines), ``fit``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"directory={str(directory)!r} is not a directory (write one with --mxcheck-dump DIR)")
    files = sorted(directory.glob("*.pt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return [torch.load(p, weights_only=False) for p in files]
