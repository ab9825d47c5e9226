"""A small PyTorch workload for check.sh: matmuls, a layer norm and a softmax on one stream, timed
with CUDA events (the GPU's own clock), so CUPTI's per-kernel durations can be compared to it.
Prints one JSON line: wall time, event time, launches made, and whether torch.profiler ran."""

import json
import sys
import time

import torch

profile = "--torch-profiler" in sys.argv
steps = 200
x = torch.randn(4096, 4096, device="cuda")
w = torch.randn(4096, 4096, device="cuda")
norm = torch.nn.LayerNorm(4096).cuda()
torch.cuda.synchronize()


def step():
    y = x @ w
    y = norm(y)
    return torch.softmax(y, dim=-1)


def run():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return time.perf_counter() - wall, start.elapsed_time(end) / 1e3


for _ in range(5):
    step()  # warm-up: cuBLAS heuristics, lazy module loads
torch.cuda.synchronize()
if profile:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        wall_s, gpu_s = run()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
else:
    wall_s, gpu_s = run()
    kernels = None
print(json.dumps({"steps": steps, "wall_s": wall_s, "gpu_event_s": gpu_s, "torch_profiler_kernels": kernels}))
