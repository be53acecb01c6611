"""On a GPU: which kernels one torch.compile'd mx_quantize call runs (16384x3072 bf16), with
their device time, against the eager call's; and dynamo's graph breaks. For finding where a
compiled call spends device time that the eager one does not."""

import functools

import torch
from torch.profiler import ProfilerActivity, profile

import mxcheck

x = torch.randn(16384, 3072, device="cuda").bfloat16()
for fmt, rule in (("e2m1", "even"), ("e4m3", "rceil")):
    eager = functools.partial(mxcheck.mx_quantize, x, fmt, scale_rule=rule)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(eager)
    for name, fn in (("eager", eager), ("compiled", compiled)):
        fn()
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        print(f"== {fmt} {rule} {name}")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=90))
    print("graph breaks:", dict(torch._dynamo.utils.counters["graph_break"]))
