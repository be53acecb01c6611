"""Say what is wrong: every mismatch counted, shown, and explained by a known behaviour.

``CATALOGUE`` holds every behaviour attribution tries, by level: quantizer conventions,
profiles and failures (``catalogue``), GEMM behaviours (``outputs``) and linear behaviours
(``linear``). A behaviour is named in a failure only where it reproduces the kernel's bits
(a GEMM or linear output: within the check's own tolerance).
"""

from __future__ import annotations

from mxcheck.diagnose.behaviour import Attribution, Behaviour, render_attributions
from mxcheck.diagnose.catalogue import NOT_BLOCK_BEHAVIOURS, QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.dump import load_dump
from mxcheck.diagnose.fit import Fit, fit
from mxcheck.diagnose.linear import LINEAR_BEHAVIOURS
from mxcheck.diagnose.outputs import GEMM_BEHAVIOURS
from mxcheck.diagnose.quantize import QuantizeDiff, attribute, compare_quantized, diagnose, report

__all__ = ["CATALOGUE", "NOT_BLOCK_BEHAVIOURS", "Attribution", "Behaviour", "Fit", "QuantizeDiff", "attribute",
           "compare_quantized", "diagnose", "fit", "load_dump", "render_attributions", "report"]

_ALL = (*QUANTIZE_BEHAVIOURS, *GEMM_BEHAVIOURS, *LINEAR_BEHAVIOURS)
CATALOGUE: dict[str, Behaviour] = {b.key: b for b in _ALL}
if len(CATALOGUE) != len(_ALL):
    raise RuntimeError("mxcheck.diagnose: two behaviours share a key")
