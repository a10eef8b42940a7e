"""How the torch references time a call, the same way as the engine's GPU benchmarks
(bench/gpu/bench_common.h time_runs): `warmup` untimed calls, then CUDA events around each call
until at least `min_runs` calls and `min_total_ms` of measured time, or `max_runs` calls."""
import statistics

import torch


def time_runs(fn, warmup=2, min_runs=5, max_runs=50, min_total_ms=1500.0):
    """Returns (median ms, min ms, number of timed calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while len(times) < max_runs and (len(times) < min_runs or sum(times) < min_total_ms):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), min(times), len(times)
