"""Which dims a kernel fails at: a divisibility pattern that splits the shapes run exactly.

aiter#4176 (gemm_a4w4 returned garbage unless K % 256 == 0) reads, over an edge-shape sweep,
as "fails at every shape with K % 256 != 0 and at no shape with K % 256 == 0". A pattern is
stated only where it holds on every shape run, with at least one failing and one correct
shape on each side of it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DIMS", "MODULI", "shape_patterns"]

DIMS = ("M", "N", "K")
MODULI = (16, 32, 64, 128, 256)


def _splits(failing: list[int], correct: list[int], m: int) -> bool:
    return all(v % m for v in failing) and all(v % m == 0 for v in correct)


def shape_patterns(failing: Mapping[str, Mapping[str, int]], correct: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per dim whose divisibility by some modulus in MODULI separates the ``failing``
    shapes (name -> {"M": .., "N": .., "K": ..}) from the ``correct`` ones; moduli the shapes
    cannot tell apart are named together. Empty when either side is empty or nothing splits."""
    if not failing or not correct:
        return []
    lines = []
    for dim in DIMS:
        bad, good = [s[dim] for s in failing.values()], [s[dim] for s in correct.values()]
        held = [m for m in MODULI if _splits(bad, good, m)]
        if held:
            also = (f" (as for {', '.join(f'{dim} % {m}' for m in held[1:])}: the shapes run do not tell them apart)"
                    if len(held) > 1 else "")
            lines.append(f"fails at every shape with {dim} % {held[0]} != 0 and at no shape with "
                         f"{dim} % {held[0]} == 0{also}")
    return lines
