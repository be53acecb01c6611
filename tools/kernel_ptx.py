"""The quantize kernel's PTX for sm90, compiled on any machine (Triton's bundled LLVM and
ptxas; no GPU needed): instructions a thread, global loads and stores by width, fp8 casts.

    python tools/kernel_ptx.py e4m3 rceil [--hw-cast] [--warps 4] [--out kernel.ptx]

The case is the benchmark's: a contiguous 16384 x 3072 bf16 tensor in 1x32 blocks, RNE.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxcheck.formats import get_format
from mxcheck.scaling import mx_cuda

POINTERS = dict(x_ptr="*bf16", u_ptr="*bf16", scales_ptr="*u8", codes_ptr="*u8", global_ptr="*u8", ue4m3_ptr="*bf16")


def compile_quantize(fmt: str, rule: str, hw_cast: bool, warps: int) -> str:
    spec = importlib.util.find_spec("mxcheck.scaling.mx_cuda_kernels")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module.mx_quantize_blocks
    x = torch.empty(16384, 3072, dtype=torch.bfloat16, device="meta")
    _, layout, _ = mx_cuda._block_layout(x, 32, False, 1, False)
    values = dict(rcp_e2m1_max=0.0, **layout, **mx_cuda._quantize_element_args(get_format(fmt)),
                  RULE=mx_cuda._RULES[rule], ROUNDING=0, RAND_BITS=False, ZERO_SCALE=0, SCALES_GIVEN=False,
                  TILE_ROWS=1, **mx_cuda._rotation_args(None, 32), HW_CAST=hw_cast)
    # Triton's specialization of a launch: pointers and multiples of 16 divisible by 16, 1 a constant
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = values.get(name)
        if name in POINTERS:
            signature[name], attrs[(i,)] = POINTERS[name], [["tt.divisibility", 16]]
        elif fn.params[i].is_constexpr or value == 1:
            signature[name], constexprs[(i,)] = "constexpr", value
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    return kernel.asm["ptx"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fmt")
    p.add_argument("rule", choices=sorted(mx_cuda._RULES))
    p.add_argument("--hw-cast", action="store_true", help="the hardware fp8 cast (e4m3 and e5m2 only; the kernels take it on a GPU)")
    p.add_argument("--warps", type=int, default=mx_cuda._QUANT_WARPS)
    p.add_argument("--out", help="write the PTX here")
    args = p.parse_args()
    ptx = compile_quantize(args.fmt, args.rule, args.hw_cast, args.warps)
    body = [line for line in ptx.splitlines() if re.match(r"\s+[a-z]+\.", line)]
    memory = collections.Counter(re.findall(r"\b((?:ld|st)\.global[.\w]*)", ptx))
    casts = collections.Counter(re.findall(r"\bcvt\.rn\.satfinite\.\w+\.f32", ptx))
    print(f"{args.fmt} {args.rule} hw_cast={args.hw_cast}: {len(body)} instructions a thread; "
          f"memory {dict(memory)}; fp8 casts {dict(casts)}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(ptx)


if __name__ == "__main__":
    main()
