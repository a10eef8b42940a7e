#!/usr/bin/env python3
"""torch's bf16 matrix products on the shapes of `entropyinfer_gpu_bench gemm` (the model's qkv, o,
gate_up and down products at a number of tokens), timed the same way: CUDA events around each call
after warm-up, median over runs, FLOPs counted as 2 * tokens * in * out. torch writes bf16 outputs
throughout; the engine writes fp32 and adds to the residual stream for o and down, which moves more
bytes, so those two rows compare a slightly larger job on the engine's side.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timing import time_runs

SHAPES = {"llama-3.1-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336)}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", default="16384,1")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    s = SHAPES[args.shape]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    products = [("qkv", s["hidden"], q + 2 * kv), ("o", q, s["hidden"]),
                ("gate_up", s["hidden"], 2 * s["intermediate"]), ("down", s["intermediate"], s["hidden"])]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
              "flops_formula": "2 * tokens * in * out", "results": []}
    generator = torch.Generator(device="cuda").manual_seed(0)
    for tokens in [int(t) for t in args.tokens.split(",") if t]:
        for name, n_in, n_out in products:
            x = torch.rand(tokens, n_in, device="cuda", dtype=torch.bfloat16, generator=generator)
            w = torch.rand(n_out, n_in, device="cuda", dtype=torch.bfloat16, generator=generator) * 0.02
            median_ms, min_ms, runs = time_runs(lambda: F.linear(x, w))
            tflops = 2.0 * tokens * n_in * n_out / (median_ms * 1e-3) / 1e12
            report["results"].append({"tokens": tokens, "product": name, "in": n_in, "out": n_out,
                                      "median_ms": median_ms, "min_ms": min_ms, "runs": runs,
                                      "tflops": tflops})
            print(f"torch tokens {tokens}, {name} ({n_in} -> {n_out}): {median_ms:.4f} ms, {tflops:.1f} TFLOP/s",
                  flush=True)
            del x, w
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
