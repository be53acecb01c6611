"""``--mxcheck-deterministic-only N``: each selected test runs N times from the same generator
states, and any difference between its recorded results fails it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mxcheck.plugin.keys import RECORD_KEY

__all__ = ["repeat_and_compare"]


def repeat_and_compare(item: pytest.Item, runs: int) -> None:
    """Make item run ``runs`` times; its recorded results must be identical each time."""
    original = item.runtest

    def runtest() -> None:
        # Every run starts from the same generator states, so only the code under test varies.
        funcargs = getattr(item, "funcargs", {})
        gens = {k: v.get_state() for k, v in funcargs.items() if isinstance(v, torch.Generator)}
        seen = []
        for i in range(runs):
            for k, state in gens.items():
                funcargs[k].set_state(state)
            start = len(item.user_properties)
            original()
            recs = [v for k, v in item.user_properties[start:] if k == RECORD_KEY]
            seen.append([(r.get("kind"), r.get("layer"), r.get("direction"), r.get("snr_db"),
                          r.get("extra", {}).get("digest")) for r in recs])
            if i:
                del item.user_properties[start:]  # the report keeps the first run's records
        for i, got in enumerate(seen[1:], start=2):
            if got != seen[0]:
                from mxcheck.assertions import NumericsError  # noqa: PLC0415

                first = next((a, b) for a, b in zip(seen[0], got, strict=False) if a != b) \
                    if len(got) == len(seen[0]) else (f"{len(seen[0])} records", f"{len(got)} records")
                raise NumericsError(f"not deterministic: run {i} of {runs}: {_describe(first[0])} differs: "
                                    f"run 1 {first[0]!r}, run {i} {first[1]!r}")

    item.runtest = runtest  # type: ignore[method-assign]


def _describe(entry: Any) -> str:
    if isinstance(entry, tuple):
        kind, layer, direction = entry[:3]
        return " ".join(str(p) for p in (kind, "check", layer, direction) if p)
    return str(entry)
