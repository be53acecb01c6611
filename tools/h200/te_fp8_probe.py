"""Why is TE's fp8 linear forward 37.6 dB against mxcheck's reference Function? (issue 13)

Run on the H200: ``PYTHONPATH=.:/tmp/site python3 tools/h200/te_fp8_probe.py`` (about 1 min).
Writes $OUT/te_quant.pt (bf16 inputs, TE's raw FP8 operands and scale_inv, te.Linear
outputs and gradients), $OUT/te_fp8_probe.{log,json}, and prints tables:

1. TE's quantizers (Float8CurrentScalingQuantizer e4m3/e5m2, Float8Quantizer with a given
   scale = delayed scaling, Float8BlockQuantizer 1x128 / 128x128) vs mxcheck.fp8_quantize
   (scale_formula="te"): differing codes, differing scale_inv bits, rowwise and columnwise.
2. te.Linear fwd/dgrad/wgrad/bgrad at 256x256x512 (bf16 params, bias) for Float8CurrentScaling
   E4M3 / HYBRID, DelayedScaling HYBRID, Float8BlockScaling, against float64 truth, the
   reference Function on the same bf16 inputs ("ref") and on the float32 inputs the
   conformance suite passes ("ref32": TE's adapter rounds x and W to bf16 first).
3. The forward GEMM alone: mxcheck's codes through torch._scaled_mm with use_fast_accum
   True / False vs TE's output. TE's recipes set fprop use_split_accumulator=False
   (common/recipe/__init__.py Float8CurrentScaling.fp8_gemm_fprop; module/base.py
   _2X_ACC_FPROP = False), dgrad / wgrad True; Float8BlockScaling forces True everywhere.
"""

# ruff: noqa: PLC0415  (TE is imported inside each stage: a missing piece fails that stage only)
from __future__ import annotations

import sys

import torch
from common import OUT, Log, table, versions
from te_compare import TE_RECIPES, compare_linear, compare_quant, reference_linear, truth

import mxcheck

M, N, K = 256, 256, 512
log = Log("te_fp8_probe")


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g) / K**0.5
    b = torch.randn(N, generator=g)
    dy = torch.randn(M, N, generator=g)
    out = {"x32": x, "w32": w, "b32": b, "dy32": dy}
    out |= {k[:-2]: v.bfloat16() for k, v in list(out.items())}
    return out


def _raw(q: object) -> dict[str, torch.Tensor | None]:
    """Codes and scale_inv of a TE Float8Tensor / Float8BlockwiseQTensor, rowwise and columnwise."""
    def get(*names: str) -> torch.Tensor | None:
        for n in names:
            v = getattr(q, n, None)
            if isinstance(v, torch.Tensor):
                return v.detach().view(torch.uint8).cpu() if v.dtype != torch.float32 else v.detach().cpu()
        return None
    return {"rowwise_data": get("_rowwise_data", "_data"), "columnwise_data": get("_columnwise_data", "_transpose"),
            "rowwise_scale_inv": get("_rowwise_scale_inv", "_scale_inv"),
            "columnwise_scale_inv": get("_columnwise_scale_inv", "_scale_inv")}


def quantize_all(t: dict[str, torch.Tensor]) -> dict[str, dict]:
    import transformer_engine.pytorch  # noqa: F401  (loads the transformer_engine_torch extension first)
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
    )

    dt = {"e4m3": tex.DType.kFloat8E4M3, "e5m2": tex.DType.kFloat8E5M2}
    dev = torch.device("cuda")
    out: dict[str, dict] = {}

    def run(name: str, tensor: str, make, meta: dict) -> None:
        try:
            q = make()(t[tensor].cuda())
            out[f"{name}:{tensor}"] = {"tensor": tensor, **meta, **_raw(q), "te_type": type(q).__name__}
            log(f"  {name}:{tensor} -> {type(q).__name__} " + ", ".join(
                f"{k}={tuple(v.shape)}" for k, v in _raw(q).items() if v is not None))
        except Exception as e:  # one quantizer failing must not hide the others
            log(f"  !! {name}:{tensor}: {type(e).__name__}: {e}")
            log.errors[f"quantize {name}:{tensor}"] = f"{type(e).__name__}: {e}"

    for fmt in ("e4m3", "e5m2"):
        for tensor in ("x", "w", "dy"):
            run(f"current_{fmt}", tensor, lambda fmt=fmt: Float8CurrentScalingQuantizer(dt[fmt], dev),
                {"fmt": fmt, "granularity": "tensor"})
    for tensor in ("x", "w", "dy"):  # delayed: a given (non-power-of-two) scale
        scale = torch.tensor([448.0 / float(t[tensor].float().abs().max()) * 0.93], dtype=torch.float32)
        run("delayed_e4m3", tensor, lambda scale=scale: Float8Quantizer(scale.cuda(), torch.zeros(1, device=dev),
                                                                         dt["e4m3"]),
            {"fmt": "e4m3", "granularity": "delayed", "scale": scale})
    for tensor, dim, gran in (("x", 1, "block1x128"), ("dy", 1, "block1x128"), ("w", 2, "block128x128"),
                              ("w", 1, "block1x128")):
        run(f"{gran}_e4m3", tensor, lambda dim=dim: Float8BlockQuantizer(dt["e4m3"], rowwise=True, columnwise=True,
                                                                         block_scaling_dim=dim),
            {"fmt": "e4m3", "granularity": gran, "power_of_2": True})
    return out


def te_recipe(key: str):
    from transformer_engine.common import recipe as r
    return {"current_e4m3": lambda: r.Float8CurrentScaling(fp8_format=r.Format.E4M3),
            "current_hybrid": lambda: r.Float8CurrentScaling(fp8_format=r.Format.HYBRID),
            "delayed_hybrid": lambda: r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=1024,
                                                       amax_compute_algo="max"),
            "block": lambda: r.Float8BlockScaling()}[key]()


def te_linear(key: str, t: dict[str, torch.Tensor], m: int = M) -> dict[str, torch.Tensor]:
    import transformer_engine.pytorch as te

    rec = te_recipe(key)
    log(f"  {key}: {rec!r}".replace("\n", " "))
    mod = te.Linear(K, N, bias=True, params_dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        mod.weight.copy_(t["w"])
        mod.bias.copy_(t["b"])
    x = t["x"][:m].cuda().requires_grad_(True)
    autocast = getattr(te, "autocast", None)
    ctx = autocast(enabled=True, recipe=rec) if autocast else te.fp8_autocast(enabled=True, fp8_recipe=rec)
    with ctx:
        y = mod(x)
    y.backward(t["dy"][:m].cuda())
    return {"y": y.detach().cpu(), "dx": x.grad.cpu(), "dw": mod.weight.grad.cpu(), "db": mod.bias.grad.cpu()}


def scaled_mm_fwd(t: dict[str, torch.Tensor], te_y: torch.Tensor) -> list[dict]:
    """mxcheck's e4m3 codes (te formula) of the bf16 x and W through torch._scaled_mm."""
    a = mxcheck.fp8_quantize(t["x"], "e4m3", scale_formula="te")
    b = mxcheck.fp8_quantize(t["w"], "e4m3", scale_formula="te")
    fa = a.codes.cuda().view(torch.float8_e4m3fn)
    fb = b.codes.cuda().view(torch.float8_e4m3fn)
    rows = []
    for fast in (True, False):
        y = torch._scaled_mm(fa, fb.t(), scale_a=a.scale_inv.cuda().reshape(()), scale_b=b.scale_inv.cuda().reshape(()),
                             bias=t["b"].cuda(), out_dtype=torch.bfloat16, use_fast_accum=fast).cpu()
        exact = t["x"].double() @ t["w"].double().T + t["b"].double()
        rows.append({"gemm": f"_scaled_mm fast_accum={fast}", "vs_te_snr": mxcheck.snr_db(y.double(), te_y.double()),
                     "diff_vs_te": int((y != te_y).sum()), "vs_truth": mxcheck.snr_db(y.double(), exact)})
    return rows


def main() -> int:
    env = log.stage("versions", versions)
    log(env)
    t = log.stage("inputs", inputs)
    if t is None:
        return log.dump() and 1
    quant = log.stage("te quantizers", lambda: quantize_all(t)) or {}
    qrows: list[dict] = []
    for name, entry in quant.items():
        log.stage(f"compare {name}", lambda name=name, entry=entry: qrows.extend(
            compare_quant(name, entry, t[entry["tensor"]])))
    outs: dict[str, dict] = {}
    lrows: list[dict] = []
    exact = truth(t["x"], t["w"], t["b"], t["dy"])
    for key in TE_RECIPES:
        o = log.stage(f"te.Linear {key}", lambda key=key: te_linear(key, t))
        if o is None:
            continue
        outs[key] = o
        refs = {}
        for rname, (xk, wk, bk) in (("ref", ("x", "w", "b")), ("ref32", ("x32", "w32", "b32"))):
            r = log.stage(f"reference {key} {rname}", lambda key=key, xk=xk, wk=wk, bk=bk: reference_linear(
                key, t[xk].cuda(), t[wk].cuda(), t[bk].cuda(), t["dy"].cuda()))
            if r is not None:
                refs[rname] = r
        log.stage(f"compare linear {key}", lambda key=key, o=o, refs=refs: lrows.extend(
            compare_linear(key, o, refs, exact)))
    grows = log.stage("fwd GEMM isolation (_scaled_mm)",
                      lambda: scaled_mm_fwd(t, outs["current_e4m3"]["y"])) or []
    for m in (40, 200):  # issue 13: cuBLASLt 'lda % 16 == 0' at M=40 / 200
        log.stage(f"te.Linear current_e4m3 M={m}", lambda m=m: {k: tuple(v.shape) for k, v in
                                                                te_linear("current_e4m3", t, m).items()})
    torch.save({"inputs": {k: v.cpu() for k, v in t.items()}, "quant": quant, "linear": outs, "env": env,
                "shape": (M, N, K)}, OUT / "te_quant.pt")
    log(f"saved {OUT / 'te_quant.pt'} ({(OUT / 'te_quant.pt').stat().st_size / 1e6:.1f} MB)")
    log.results.update({"quant_rows": qrows, "linear_rows": lrows, "gemm_rows": grows})
    log("\n" + table(qrows, ["quant", "layout", "codes_diff", "of", "max_code_step", "scale_inv_diff",
                             "scale_inv_te", "scale_inv_mx", "scale_layout", "note"]))
    log("\n" + table(lrows, ["recipe", "dir", "te_vs_truth", "ref_vs_truth", "te_vs_ref", "diff_ref",
                             "ref32_vs_truth", "te_vs_ref32", "diff_ref32", "of"]))
    log("\n" + table(grows, ["gemm", "vs_te_snr", "diff_vs_te", "vs_truth"]))
    log.dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
