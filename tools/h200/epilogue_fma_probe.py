"""On a GPU: the fused GEMM epilogue launched with FMA contraction on (Triton's default)
differs from the torch epilogue, so tests/test_gemm_epilogue.py can see a contraction; with
it off (as mxcheck launches it) it does not. Prints the count of differing outputs."""

import torch

from mxcheck.scaling import mx_cuda

gen = torch.Generator().manual_seed(0)
acc = (torch.randn(512, 512, generator=gen) * 1000).cuda()
sa, sb = torch.rand((), generator=gen).cuda() + 0.1, (torch.rand(512, 1, generator=gen) + 0.1).cuda()
bias = (torch.randn(512, generator=gen) * 64).cuda()
want = (acc * (sa * sb.reshape(1, -1))) + bias
kernel = mx_cuda._kernels()["epilogue"]
for fusion in (True, False):
    out = torch.empty_like(acc)
    kernel[(acc.numel() // 2048,)](acc, sa, sb, bias, out, acc.numel(), 512, SA_PER_ROW=False, SB_PER_COL=True,
                                   HAS_BIAS=True, WIDE=False, BLOCK=2048, enable_fp_fusion=fusion)
    print(f"enable_fp_fusion={fusion}: {(out.view(torch.int32) != want.view(torch.int32)).sum().item()} of "
          f"{out.numel()} float32 outputs differ from the torch epilogue")
