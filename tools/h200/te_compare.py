"""Compare TransformerEngine's FP8 operands and linear outputs with mxcheck's oracle.

Shared by ``te_fp8_probe.py`` (on the H200) and ``te_offline_check.py`` (on te_quant.pt
anywhere). An entry of te_quant.pt's ``quant`` dict holds what one TE quantizer made of one
bf16 tensor: ``rowwise_data`` / ``columnwise_data`` (uint8 codes; columnwise is the
transposed [K, M] copy TE's dgrad / wgrad GEMMs read) and their ``*_scale_inv`` (float32,
TE's padded layout), plus ``fmt`` (e4m3 / e5m2), ``granularity`` (tensor, block1x128,
block128x128), ``power_of_2`` and, for delayed scaling, the ``scale`` TE was given.
"""

from __future__ import annotations

from typing import Any

import torch

import mxcheck
from mxcheck.formats import encode
from mxcheck.functions import make_delayed_states, quant_linear
from mxcheck.recipes import RECIPES, OperandSpec, Recipe

FP8_BLOCK = RECIPES["fp8-block"]  # TE Float8BlockScaling, as mxcheck.recipes models it
_E4M3_TE = OperandSpec("e4m3", "tensor", scale_formula="te")
_E5M2_TE = OperandSpec("e5m2", "tensor", scale_formula="te")
# mxcheck recipes as TE runs them: TE's scale formula (fp8_max / amax in float32, no eps clamp).
TE_RECIPES = {
    "current_e4m3": Recipe("fp8-te", **dict.fromkeys(("x_row", "w_row", "g_row", "w_col", "g_col", "x_col"),
                                                    _E4M3_TE)),
    "current_hybrid": Recipe("fp8-hybrid-te", x_row=_E4M3_TE, w_row=_E4M3_TE, w_col=_E4M3_TE, x_col=_E4M3_TE,
                             g_row=_E5M2_TE, g_col=_E5M2_TE),
    "delayed_hybrid": RECIPES["fp8-delayed"],
    "block": FP8_BLOCK,
}


def snr(test: torch.Tensor, ref: torch.Tensor) -> float:
    return mxcheck.snr_db(test.double().cpu(), ref.double().cpu())


def _crop_match(te: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, str]:
    """TE's scale_inv cropped to mxcheck's shape, directly or transposed (TE pads to 4 and
    stores 1x128 scales transposed); which orientation was used."""
    te = te.float().cpu()
    if te.dim() == 0 or want.dim() == 0:
        return te.reshape(()), "scalar"
    r, c = want.shape
    if te.shape[0] >= r and te.shape[1] >= c:
        direct = te[:r, :c]
        if torch.equal(direct.view(torch.int32), want.view(torch.int32)) or te.shape[0] < c or te.shape[1] < r:
            return direct, "direct"
    if te.shape[0] >= c and te.shape[1] >= r:
        return te[:c, :r].t().contiguous(), "transposed"
    return te, "unmatched"


def expected(t: torch.Tensor, entry: dict[str, Any]) -> Any:
    """mxcheck's quantization of the (already oriented) bf16 tensor t as the entry's quantizer."""
    if entry["granularity"] == "delayed":  # Float8Quantizer with a given scale: fp8(x * scale)
        scale = entry["scale"].float().cpu()
        return {"codes": encode(t.float().cpu() * scale, entry["fmt"]), "scale_inv": 1.0 / scale}
    q = mxcheck.fp8_quantize(t.cpu(), entry["fmt"], granularity=entry["granularity"], scale_formula="te",
                             power_of_2=entry.get("power_of_2", False))
    return {"codes": q.codes, "scale_inv": q.scale_inv}


def compare_quant(name: str, entry: dict[str, Any], tensor: torch.Tensor) -> list[dict[str, Any]]:
    """Rows: per layout (rowwise / columnwise), differing codes and scale_inv bits vs mxcheck."""
    rows = []
    for layout, t in (("rowwise", tensor), ("columnwise", tensor.t().contiguous())):
        data = entry.get(f"{layout}_data")
        if data is None:
            rows.append({"quant": name, "layout": layout, "note": "TE made none"})
            continue
        want = expected(t, entry)
        codes = data.view(torch.uint8).cpu()
        if codes.shape != want["codes"].shape and codes.t().shape == want["codes"].shape:
            codes = codes.t()  # a columnwise copy stored untransposed
        got_s, orient = _crop_match(entry[f"{layout}_scale_inv"], want["scale_inv"])
        s_diff = int((got_s.reshape(want["scale_inv"].shape).view(torch.int32)
                      != want["scale_inv"].float().view(torch.int32)).sum()) if orient != "unmatched" else -1
        diff = codes != want["codes"]
        steps = (codes.to(torch.int16) - want["codes"].to(torch.int16)).abs()
        rows.append({"quant": name, "layout": layout, "codes_diff": int(diff.sum()), "of": diff.numel(),
                     "max_code_step": int(steps.max()), "scale_inv_diff": s_diff,
                     "scale_inv_te": f"{got_s.flatten()[0].item():.9g}",
                     "scale_inv_mx": f"{want['scale_inv'].flatten()[0].item():.9g}", "scale_layout": orient})
    return rows


def reference_linear(recipe_key: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                     dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """mxcheck's reference Function (fwd, dgrad, wgrad, bgrad) on the given tensors."""
    recipe = TE_RECIPES[recipe_key]
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    states = make_delayed_states(recipe) or None
    y = quant_linear(x, w, b, recipe, states=states)
    y.backward(dy.to(y.dtype))
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad, "db": b.grad}


def truth(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    xd, wd, gd = x.double().cpu(), w.double().cpu(), dy.double().cpu()
    return {"y": xd @ wd.T + b.double().cpu(), "dx": gd @ wd, "dw": gd.T @ xd, "db": gd.sum(0)}


def compare_linear(recipe_key: str, te_out: dict[str, torch.Tensor], refs: dict[str, dict[str, torch.Tensor]],
                   exact: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Rows per direction: SNR of TE and of each reference vs float64 truth, TE vs each
    reference, and how many outputs differ."""
    rows = []
    for d in ("y", "dx", "dw", "db"):
        if te_out.get(d) is None:
            continue
        te = te_out[d].cpu()
        row: dict[str, Any] = {"recipe": recipe_key, "dir": {"y": "fwd", "dx": "dgrad", "dw": "wgrad", "db": "bgrad"}[d],
                               "te_vs_truth": snr(te, exact[d])}
        for name, ref in refs.items():
            r = ref[d].cpu().to(te.dtype)
            row[f"{name}_vs_truth"] = snr(r, exact[d])
            row[f"te_vs_{name}"] = snr(te, r)
            row[f"diff_{name}"] = int((te != r).sum())
        row["of"] = te.numel()
        rows.append(row)
    return rows
