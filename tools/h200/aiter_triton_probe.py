"""AITER's Triton MXFP4 quantizer and FP4 GEMM (amd-aiter 0.1.7.post2.dev18) on the H200.

``PYTHONPATH=.:/tmp/site MXCHECK_AITER_PATH=/tmp/aiter python3 tools/h200/aiter_triton_probe.py``
(about 1 min; unzip the wheel into /tmp/aiter first). Writes $OUT/aiter_triton_probe.{log,json}
and $OUT/aiter_quant.pt, prints a table.

Claim checked (issue 13): ``_dynamic_mxfp4_quant_kernel_asm_layout`` (aiter/utility/fp4_utils.py)
stores ``scale_e8m0_unbiased.to(tl.uint8) + 127`` with a float exponent that is negative for
every block whose even-rounded amax is below 4; float -> unsigned of a negative value is
undefined, NVIDIA's cvt saturates it to 0, so such blocks get byte 127, while the elements
were scaled with the right exponent (``exp2(-e)``). The probe compares with
mxcheck.mx_quantize(x, "e2m1", scale_rule="even") and with that "saturated" byte model, and
lists the differing codes with their scaled values.
"""


from __future__ import annotations

import sys

import torch
from aiter_loader import load_aiter, stub_triton_arch
from common import OUT, Log, table, versions

import mxcheck
from mxcheck.formats import decode

log = Log("aiter_triton_probe")


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(99)
    randn = torch.randn(256, 4096, generator=g)
    rows = torch.randn(128, 1024, generator=g) * torch.logspace(-3, 3, 128).unsqueeze(1)
    return {"randn_256x4096": randn.bfloat16(), "rows1e-3..1e3_128x1024": rows.bfloat16()}


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    p = packed.view(torch.uint8).cpu()
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)[:, :n]  # low nibble = even index


def saturated_byte(e: torch.Tensor) -> torch.Tensor:
    """The kernel's byte if float -> uint8 saturates (NVIDIA cvt.rzi.sat.u8): max(e, 0) + 127, mod 256."""
    return ((e.clamp(min=0, max=255).to(torch.int32) + 127) % 256).to(torch.uint8)


def compare(name: str, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> dict:
    m, n = x.shape
    ref = mxcheck.mx_quantize(x.float(), "e2m1", scale_rule="even")
    got_s = scales.view(torch.uint8).cpu()[:m, : n // 32]
    e = ref.scales.to(torch.int32) - 127  # the exponent the kernel computes (and scales the elements by)
    sat = saturated_byte(e)
    sdiff = got_s != ref.scales
    binades = (got_s.to(torch.int32) - ref.scales.to(torch.int32)).abs()
    cdiff = codes != ref.codes
    scaled = (x.float() * torch.exp2(-e.float()).repeat_interleave(32, dim=1))
    idx = cdiff.nonzero()[:20].tolist()
    examples = [{"at": (i, j), "x": float(x[i, j]), "scaled": float(scaled[i, j]), "mx_code": int(ref.codes[i, j]),
                 "kernel_code": int(codes[i, j]), "mx_value": float(decode(ref.codes[i, j:j + 1], "e2m1")[0]),
                 "kernel_value": float(decode(codes[i, j:j + 1], "e2m1")[0])} for i, j in idx]
    ties = torch.isin(scaled.abs()[cdiff], torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]))
    return {"input": name, "blocks": sdiff.numel(), "scale_diff": int(sdiff.sum()),
            "binades_max": int(binades.max()), "matches_saturated_model": int((got_s == sat).sum()),
            "e_negative_blocks": int((e < 0).sum()), "codes_diff": int(cdiff.sum()), "codes": cdiff.numel(),
            "codes_diff_at_ties": int(ties.sum()), "examples": examples}


def quant_all(t: dict[str, torch.Tensor]) -> list[dict]:
    fp4 = __import__("aiter.utility.fp4_utils", fromlist=["dynamic_mxfp4_quant"])
    rows, saved = [], {}
    for name, x in t.items():
        packed, scales = fp4.dynamic_mxfp4_quant(x.cuda())
        codes = unpack(packed, x.shape[1])
        saved[name] = {"x": x, "packed": packed.view(torch.uint8).cpu(), "scales": scales.view(torch.uint8).cpu()}
        rows.append(compare(name, x, codes, scales))
        log(f"  {name}: {dict((k, v) for k, v in rows[-1].items() if k != 'examples')}")
        for ex in rows[-1]["examples"][:8]:
            log(f"    {ex}")
    torch.save(saved, OUT / "aiter_quant.pt")
    return rows


def gemm_try() -> dict:
    info = stub_triton_arch("gfx950")
    gemm = __import__("aiter.ops.triton.gemm_afp4wfp4", fromlist=["gemm_afp4wfp4"])
    fp4 = __import__("aiter.utility.fp4_utils", fromlist=["dynamic_mxfp4_quant"])
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 512, generator=g).bfloat16().cuda()
    w = (torch.randn(256, 512, generator=g) / 512**0.5).bfloat16().cuda()
    xq, xs = fp4.dynamic_mxfp4_quant(x)
    wq, ws = fp4.dynamic_mxfp4_quant(w)
    log(f"  arch stub: {info.get_arch()} is_fp4_avail={info.is_fp4_avail()}")
    y = gemm.gemm_afp4wfp4(xq, wq, xs, ws, torch.bfloat16)
    exact = x.double() @ w.double().T
    return {"shape": tuple(y.shape), "snr_vs_bf16_inputs_truth": mxcheck.snr_db(y.double().cpu(), exact.cpu())}


def main() -> int:
    log(log.stage("versions", versions))
    log.stage("load aiter (bare packages, chip_info stub)", lambda: str(load_aiter()))
    t = inputs()
    rows = log.stage("dynamic_mxfp4_quant vs mxcheck even", lambda: quant_all(t)) or []
    log.stage("gemm_afp4wfp4 with arch stubbed to gfx950", gemm_try)
    log("\n" + table(rows, ["input", "blocks", "scale_diff", "binades_max", "matches_saturated_model",
                            "e_negative_blocks", "codes_diff", "codes", "codes_diff_at_ties"]))
    log.dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
