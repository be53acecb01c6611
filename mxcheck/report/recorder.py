"""The ``numerics`` fixture's recorder: the assertions with a test's context, each
comparison recorded into the report as a :class:`~mxcheck.report.schema.Record` (pass or
fail) before a failure is raised."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from mxcheck.assertions import (
    RoundingResult,
    SNRResult,
    check_bitwise,
    check_grads,
    check_rounding,
    check_snr,
)
from mxcheck.determinism import check_deterministic
from mxcheck.formats import FloatFormat
from mxcheck.manifest import check_precision
from mxcheck.metrics import BitDiff
from mxcheck.nested import tensors
from mxcheck.outcome import CONTEXT_KEYS, Context, Outcome, raise_unless
from mxcheck.report.schema import Record

__all__ = ["Numerics"]


def _digest(t: torch.Tensor) -> str:
    """First 16 hex digits of the sha256 of the tensor's bytes (row-major)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    raw = flat.to(torch.uint8) if flat.dtype == torch.bool else flat.view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]



class Numerics:
    """The ``numerics`` fixture: the assertions with the test's context, each
    recorded into the report (pass or fail) before a failure is raised.

    Give each comparison of one test a distinct layer/direction through ``.context`` so
    ``mxcheck compare`` can pair it with its baseline. An empty recipe is recorded as "none".
    """

    def __init__(self, record: Callable[[Record], None], test_id: str,
                 backend: str = "emulated", recipe: str = "", *, context: Context = None) -> None:
        self._record = record
        self.test_id = test_id
        self._context = {"backend": backend, "recipe": recipe, **dict(context or {})}

    def context(self, **fields: object) -> Numerics:
        """A new Numerics with these fields (backend, recipe, layer, direction, m, n, k)."""
        unknown = sorted(set(fields) - set(CONTEXT_KEYS))
        if unknown:
            raise ValueError(f"unknown context field(s) {unknown}; expected {list(CONTEXT_KEYS)}")
        return Numerics(self._record, self.test_id, context={**self._context, **fields})

    def _run(self, kind: str, out: Outcome, digest: str | None = None) -> Any:
        self._write(kind, out, digest)
        return raise_unless(out)

    def record(self, kind: str, out: Outcome, test: torch.Tensor | None = None) -> Outcome:
        """Record an outcome without raising: a check that makes many comparisons records each
        and fails once, after the last (``conformance.check_quantize``)."""
        self._write(kind, out, None if test is None else _digest(test))
        return out

    def _write(self, kind: str, out: Outcome, digest: str | None) -> None:
        ctx, fields = self._context, dict(out.fields)
        extra = {**fields.pop("extra", {}), **({"digest": digest} if digest else {})}
        self._record(Record(
            test_id=self.test_id, backend=str(ctx.get("backend") or "emulated"),
            recipe=str(ctx.get("recipe") or "none"), layer=ctx.get("layer"),
            direction=ctx.get("direction"), m=ctx.get("m"), n=ctx.get("n"), k=ctx.get("k"),
            kind=kind, message=out.message, extra=extra, **fields))

    def snr(self, test: torch.Tensor, ref: torch.Tensor, threshold_db: float) -> SNRResult:
        return self._run("snr", check_snr(test, ref, threshold_db, self._context), _digest(test))

    def bitwise(self, test: torch.Tensor, ref: torch.Tensor,
                fmt: str | FloatFormat | None = None) -> BitDiff:
        return self._run("bitwise", check_bitwise(test, ref, fmt, self._context), _digest(test))

    def within_rounding(self, result: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, *,
                        k: int = 1) -> RoundingResult:
        return self._run("rounding", check_rounding(result, exact, dtype, k, self._context))

    def nonzero_grads(self, params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]], *,
                      names: Sequence[str] | None = None) -> dict[str, float | None]:
        return self._run("grads", check_grads(params, names, self._context))

    def precision(self, manifest: Any, recipe: Any, **check_kwargs: Any) -> Any:
        """``manifest.check(recipe)`` (a ``mxcheck.manifest.PrecisionManifest``), recorded
        with the whole manifest in the record's ``extra["precision_manifest"]``."""
        return self._run("precision", check_precision(manifest, recipe, check_kwargs, self._context))

    def deterministic(self, fn: Callable[..., Any], *args: Any, runs: int = 3,
                      **kwargs: Any) -> Any:
        out = check_deterministic(fn, args, kwargs, runs, self._context)
        found = tensors(out.value) if out.passed else []
        digest = hashlib.sha256("".join(map(_digest, found)).encode()).hexdigest()[:16]
        return self._run("deterministic", out, digest if found else None)
