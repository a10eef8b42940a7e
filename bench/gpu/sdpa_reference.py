#!/usr/bin/env python3
"""torch scaled_dot_product_attention, causal, bf16, per backend (FlashAttention-2 and cuDNN), on the
shapes of the in-house attention benchmark, timed the same way: CUDA events around each call after
warm-up, median over runs, FLOPs counted as 4 * n^2 * head_dim * q_heads / 2 (the causal half).

Queries are laid out as the engine keeps them ([n, q_heads, head_dim], viewed as [1, q_heads, n, head_dim])
and keys/values as its head-major cache ([1, kv_heads, n, head_dim]); grouped-query attention goes through
enable_gqa=True, or through K/V expanded to q_heads when a backend refuses it (recorded in the output).
"""
import argparse
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from torch_timing import time_runs


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    hq, hkv, d = args.q_heads, args.kv_heads, args.head_dim
    device = torch.device("cuda")
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "q_heads": hq, "kv_heads": hkv, "head_dim": d,
        "flops_formula": "4 * n^2 * head_dim * q_heads / 2 (causal)",
        "prefill": [],
    }
    backends = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
    generator = torch.Generator(device=device).manual_seed(0)
    for n in lengths:
        q = (torch.rand(1, n, hq, d, device=device, generator=generator, dtype=torch.float32) * 4 - 2)
        q = q.to(torch.bfloat16).transpose(1, 2)  # [1, hq, n, d] over [n, hq, d] memory
        k = (torch.rand(1, hkv, n, d, device=device, generator=generator) * 2 - 1).to(torch.bfloat16)
        v = (torch.rand(1, hkv, n, d, device=device, generator=generator) * 2 - 1).to(torch.bfloat16)
        flops = 4.0 * n * n * d * hq / 2.0
        for name, backend in backends:
            entry = {"kernel": name, "tokens": n}
            attempts = [("gqa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))]
            expanded = {}

            def run_expanded():
                if "k" not in expanded:
                    expanded["k"] = k.repeat_interleave(hq // hkv, dim=1)
                    expanded["v"] = v.repeat_interleave(hq // hkv, dim=1)
                return F.scaled_dot_product_attention(q, expanded["k"], expanded["v"], is_causal=True)

            attempts.append(("kv expanded to q_heads", run_expanded))
            errors = []
            for how, fn in attempts:
                try:
                    with sdpa_kernel([backend]):
                        median, fastest, runs = time_runs(fn)
                    entry.update({"gqa": how, "median_ms": median, "min_ms": fastest, "runs": runs,
                                  "tflops": flops / (median * 1e-3) / 1e12})
                    break
                except Exception as error:  # the backend refused this form; try the next
                    errors.append(f"{how}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                    torch.cuda.synchronize()
            if errors:
                entry["refused"] = errors
            expanded.clear()
            report["prefill"].append(entry)
            print(f"prefill {name} n={n}: " +
                  (f"{entry['median_ms']:.3f} ms, {entry['tflops']:.1f} TFLOP/s ({entry['gqa']}, {entry['runs']} runs)"
                   if "tflops" in entry else "unavailable: " + "; ".join(errors)), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
