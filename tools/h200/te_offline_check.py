"""Offline: compare a saved $OUT/te_quant.pt (from te_fp8_probe.py) with mxcheck, no GPU needed.

``PYTHONPATH=. python3 tools/h200/te_offline_check.py [path/to/te_quant.pt]`` (default
$OUT/te_quant.pt). Same tables as the probe, with the reference Function on this machine's
device (CPU: float32 emulated GEMMs), so quantization can be dug into without device time.
``--fabricate PATH`` writes a te_quant.pt made by mxcheck itself (codes, scales and the
reference Function's outputs in TE's layouts): every row must then show 0 differences.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common import OUT, Log, table
from te_compare import TE_RECIPES, compare_linear, compare_quant, reference_linear, truth

import mxcheck

log = Log("te_offline_check")


def fabricate(path: Path) -> None:
    """A te_quant.pt from mxcheck: quant entries in TE's layouts, linear outputs = the reference."""
    g = torch.Generator().manual_seed(7)
    m, n, k = 256, 256, 512
    t32 = {"x32": torch.randn(m, k, generator=g), "w32": torch.randn(n, k, generator=g) / k**0.5,
           "b32": torch.randn(n, generator=g), "dy32": torch.randn(m, n, generator=g)}
    t = t32 | {key[:-2]: v.bfloat16() for key, v in t32.items()}
    quant = {}
    for name, tensor, gran, p2 in (("current_e4m3", "x", "tensor", False), ("block1x128_e4m3", "x", "block1x128", True),
                                   ("block128x128_e4m3", "w", "block128x128", True)):
        rq = mxcheck.fp8_quantize(t[tensor], "e4m3", granularity=gran, scale_formula="te", power_of_2=p2)
        cq = mxcheck.fp8_quantize(t[tensor].t().contiguous(), "e4m3", granularity=gran, scale_formula="te",
                                  power_of_2=p2)
        # TE stores 1x128 scale_inv transposed and pads to 4 (float8_blockwise_tensor.py get_scale_shape)
        rs, cs = ((rq.scale_inv.t(), cq.scale_inv.t()) if gran == "block1x128" else (rq.scale_inv, cq.scale_inv))
        quant[f"{name}:{tensor}"] = {"tensor": tensor, "fmt": "e4m3", "granularity": gran, "power_of_2": p2,
                                     "rowwise_data": rq.codes, "columnwise_data": cq.codes,
                                     "rowwise_scale_inv": rs, "columnwise_scale_inv": cs}
    linear = {key: reference_linear(key, t["x"], t["w"], t["b"], t["dy"]) for key in ("current_e4m3", "block")}
    torch.save({"inputs": t, "quant": quant, "linear": linear, "env": {"fabricated": "mxcheck"},
                "shape": (m, n, k)}, path)
    log(f"fabricated {path}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fabricate"]:
        fabricate(Path(argv[1]))
        return 0
    path = Path(argv[0]) if argv else OUT / "te_quant.pt"
    d = torch.load(path, weights_only=False)
    log(f"{path}: env {d.get('env')}")
    t = d["inputs"]
    qrows: list[dict] = []
    for name, entry in d["quant"].items():
        log.stage(f"compare {name}", lambda name=name, entry=entry: qrows.extend(
            compare_quant(name, entry, t[entry["tensor"]])))
    exact = truth(t["x"], t["w"], t["b"], t["dy"])
    lrows: list[dict] = []
    for key, outs in d["linear"].items():
        if key not in TE_RECIPES:
            continue
        refs = {}
        for rname, (xk, wk, bk) in (("ref", ("x", "w", "b")), ("ref32", ("x32", "w32", "b32"))):
            if xk in t:
                r = log.stage(f"reference {key} {rname}", lambda key=key, xk=xk, wk=wk, bk=bk: reference_linear(
                    key, t[xk], t[wk], t[bk], t["dy"]))
                if r is not None:
                    refs[rname] = r
        log.stage(f"compare linear {key}", lambda key=key, outs=outs, refs=refs: lrows.extend(
            compare_linear(key, outs, refs, exact)))
    log.results.update({"quant_rows": qrows, "linear_rows": lrows})
    log("\n" + table(qrows, ["quant", "layout", "codes_diff", "of", "max_code_step", "scale_inv_diff",
                             "scale_inv_te", "scale_inv_mx", "scale_layout", "note"]))
    log("\n" + table(lrows, ["recipe", "dir", "te_vs_truth", "ref_vs_truth", "te_vs_ref", "diff_ref",
                             "ref32_vs_truth", "te_vs_ref32", "diff_ref32", "of"]))
    log.dump()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
