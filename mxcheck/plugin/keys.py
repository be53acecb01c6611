"""The names records, skips and the collector travel under (on test reports and the config)."""

from __future__ import annotations

__all__ = ["RECORD_KEY", "SEEDED_FIXTURES", "WITNESS_DRIFT"]

RECORD_KEY = "mxcheck_record"
SEEDED_FIXTURES = frozenset({"mxcheck_generator", "mxcheck_seed"})
# An xfail whose reason starts so is a witness library (ml_dtypes, torch, gfloat, torchao)
# newer than the versions a test pinned, answering differently: counted in the report.
WITNESS_DRIFT = "witness drift:"
