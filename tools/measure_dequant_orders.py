"""Measure how far the released float32 NVFP4 dequantization orders stray from the exact
product, on the inputs the quantize check feeds (``conformance.basic.quantize_inputs``).

    PYTHONPATH=. python tools/measure_dequant_orders.py [--recipe nvfp4-1x16]

Per order (``conformance.values.DEQUANT_ORDERS``): elements whose float32 value differs from
the exact product rounded once, the largest distance in float32 ulps (of the exact value),
and elements the order loses (Inf where the true value is finite, 0 where it is not 0), which
the judge does not count as legitimate. Then the closest the spread comes
to a neighbouring code: the smallest gap, relative to the value, between the spread and the
value of the element code one step up or down under the same scale (one code off must fail).
docs/backends.md quotes the numbers.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import torch

from mxcheck.conformance.basic import quantize_inputs
from mxcheck.conformance.values import DEQUANT_ORDERS, dequant_spread
from mxcheck.gemm import quantize_operand
from mxcheck.recipes import get_recipe


def _ulps(v: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|v - exact| in float32 ulps of exact (the spacing at exact's binade, subnormals included)."""
    spacing = (torch.nextafter(exact.abs(), torch.tensor(math.inf)) - exact.abs()).double()
    return ((v.double() - exact.double()).abs() / spacing).nan_to_num(0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="nvfp4-1x16")
    args = parser.parse_args()
    recipe = get_recipe(args.recipe)
    stats = {name: [0, 0.0, 0] for name in DEQUANT_ORDERS}
    elements, closest = 0, math.inf
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    for _, name, _, x in quantize_inputs(recipe, torch.Generator().manual_seed(0), dtypes, "cpu"):
        q = quantize_operand(x, recipe.spec(name))
        exact = q.dequantize()
        finite = torch.isfinite(exact)
        elements += int(finite.sum())
        e, s, a = q.decoded_factors()
        for order, f in DEQUANT_ORDERS.items():
            v = f(e, s, a)
            st = stats[order]
            lost = finite & (~torch.isfinite(v) | ((v == 0) & (exact != 0)))
            st[0] += int(((v != exact) & finite & ~lost).sum())
            dist = _ulps(v, exact)[finite & ~lost]
            st[1] = max(st[1], float(dist.max()) if dist.numel() else 0.0)
            st[2] += int(lost.sum())
        # one code step up and down in magnitude: how near the spread comes to those values
        lo, hi = dequant_spread(q, torch.float32)
        for step, can in ((1, (q.codes & 0x7) < 7), (-1, (q.codes & 0x7) > 1)):
            other = replace(q, codes=torch.where(can, q.codes + step, q.codes)).dequantize()
            keep = can & finite & (exact != 0)
            if bool(keep.any()):
                gap = torch.minimum((other - hi).abs(), (other - lo).abs()) / other.abs()
                closest = min(closest, float(gap[keep].min()))
    print(f"recipe {recipe.name}: {elements:,} finite values on the quantize check's inputs")
    print("| order | values differing from the exact product | largest distance (float32 ulps) | values lost (Inf or 0) |")
    print("|---|---|---|---|")
    for order, (n, ulps, inf) in stats.items():
        print(f"| {order} | {n:,} | {ulps:g} | {inf:,} |")
    print(f"closest approach of the spread to a value one code away: {closest:.3g} of that value")


if __name__ == "__main__":
    main()
