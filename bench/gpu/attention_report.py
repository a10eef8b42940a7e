#!/usr/bin/env python3
"""Merges the in-house attention benchmark (entropyinfer_gpu_bench attention --json) and the torch SDPA
reference (sdpa_reference.py --json) of one run into one JSON and a markdown table."""
import argparse
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--sdpa", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    args = parser.parse_args()
    ours = json.load(open(args.ours))
    sdpa = json.load(open(args.sdpa))
    rows = {}
    for entry in ours.get("prefill", []) + sdpa.get("prefill", []):
        rows.setdefault(entry["tokens"], {})[entry["kernel"]] = entry.get("tflops")
    merged = {"date": args.date, "gpu": ours.get("device"), "command": args.command,
              "shape": {k: ours.get(k) for k in ("q_heads", "kv_heads", "head_dim")},
              "flops_formula": ours.get("flops_formula"), "torch": sdpa.get("torch"), "cudnn": sdpa.get("cudnn"),
              "copy_bandwidth_gbps": ours.get("copy_bandwidth_gbps"),
              "prefill": ours.get("prefill", []) + sdpa.get("prefill", []), "decode": ours.get("decode", [])}
    json.dump(merged, open(args.json, "w"), indent=2)

    def cell(value):
        return "-" if value is None else f"{value:.0f}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a / b:.2f}"

    lines = [f"# Attention kernels, {args.date}, {merged['gpu']}", "",
             f"Causal prefill, bf16 (ours FP8: flash_prefill_fp8, E4M3 operands), {merged['shape']['q_heads']} query heads, {merged['shape']['kv_heads']} KV heads, "
             f"head size {merged['shape']['head_dim']}; TFLOP/s = {merged['flops_formula']} / median time "
             f"(CUDA events, after warm-up). torch {merged['torch']}, cuDNN {merged['cudnn']}, same device call.", "",
             f"Command: `{args.command}`", "",
             "| tokens | ours wgmma | ours wgmma (no overlap) | ours mma.sync | SDPA FlashAttention-2 | SDPA cuDNN | "
             "wgmma / FA2 | wgmma / cuDNN | ours FP8 | FP8 / wgmma |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted(rows):
        r = rows[n]
        best = r.get("wgmma")
        lines.append(f"| {n} | {cell(r.get('wgmma'))} | {cell(r.get('wgmma_simple'))} | {cell(r.get('mma'))} | "
                     f"{cell(r.get('sdpa_flash'))} | {cell(r.get('sdpa_cudnn'))} | {ratio(best, r.get('sdpa_flash'))} | "
                     f"{ratio(best, r.get('sdpa_cudnn'))} | {cell(r.get('fp8'))} | {ratio(r.get('fp8'), best)} |")
    if merged["decode"]:
        lines += ["", f"Split-KV decode, one token over the cache (device copy bandwidth "
                      f"{merged['copy_bandwidth_gbps']:.0f} GB/s, read + write):", "",
                  "| context | splits | time (us) | K/V GB/s | of copy bandwidth |", "| ---: | ---: | ---: | ---: | ---: |"]
        for d in merged["decode"]:
            lines.append(f"| {d['context']} | {d['splits']} | {d['median_us']:.1f} | {d['kv_gbps']:.0f} | "
                         f"{100 * d['fraction_of_copy']:.0f}% |")
    open(args.markdown, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
