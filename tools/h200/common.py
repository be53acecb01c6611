"""Shared pieces of the H200 probes: $OUT, staged runs that log and continue, tables."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("OUT", "out"))


class Log:
    """Every stage runs in try/except: an exception is logged with its traceback and the
    probe goes on, so one device run gives everything it can."""

    def __init__(self, name: str) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.path = OUT / f"{name}.log"
        self.path.write_text("")
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    def __call__(self, *parts: Any) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        self(f"== {name}")
        try:
            out = fn()
        except Exception as e:  # a probe stage may fail any way; record it and go on
            self.errors[name] = f"{type(e).__name__}: {e}"
            self(f"!! {name} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            return None
        self.results[name] = out if _jsonable(out) else repr(out)[:2000]
        return out

    def dump(self) -> Path:
        path = OUT / f"{self.name}.json"
        path.write_text(json.dumps({"results": self.results, "errors": self.errors}, indent=1, default=str))
        self(f"wrote {path} and {self.path}")
        return path


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
    except (TypeError, ValueError):
        return False
    return True


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """A plain fixed-width table of ``rows`` (missing cells blank)."""
    def cell(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)
    cells = [[cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    """torch, triton, CUDA, GPU and the vendor packages this probe may use."""
    import importlib.metadata as md  # noqa: PLC0415

    import torch  # noqa: PLC0415

    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                                  "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for pkg in ("triton", "transformer_engine", "transformer-engine", "torchao", "amd-aiter"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out
