"""Say what is wrong: every mismatch counted, shown, and explained by a known behaviour.

``CATALOGUE`` holds every behaviour attribution tries, by level: quantizer conventions,
profiles and failures (``catalogue``), and the GEMM and linear behaviours (``outputs``).
"""

from __future__ import annotations

from mxcheck.diagnose.behaviour import Attribution, Behaviour, render_attributions
from mxcheck.diagnose.catalogue import QUANTIZE_BEHAVIOURS
from mxcheck.diagnose.quantize import QuantizeDiff, attribute, compare_quantized, diagnose, report

__all__ = ["CATALOGUE", "Attribution", "Behaviour", "QuantizeDiff", "attribute", "compare_quantized", "diagnose",
           "render_attributions", "report"]

CATALOGUE: dict[str, Behaviour] = {b.key: b for b in QUANTIZE_BEHAVIOURS}
if len(CATALOGUE) != len(QUANTIZE_BEHAVIOURS):
    raise RuntimeError("mxcheck.diagnose: two behaviours share a key")
