#!/usr/bin/env python3
"""Merges the CUDA engine's model benchmark (entropyinfer_gpu_bench model --json) and the transformers
reference (hf_reference.py --json) of one run into one JSON and a markdown table."""
import argparse
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--hf", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    args = parser.parse_args()
    ours = json.load(open(args.ours))
    try:
        hf = json.load(open(args.hf))
    except (OSError, ValueError):
        hf = {"prefill": [], "decode": []}
    merged = {"date": args.date, "gpu": ours.get("device"), "command": args.command, "shape": ours.get("shape"),
              "engine": ours, "transformers": hf}
    json.dump(merged, open(args.json, "w"), indent=2)
    hf_prefill = {e["tokens"]: e for e in hf.get("prefill", [])}
    hf_decode = {e["context"]: e for e in hf.get("decode", [])}
    gib = lambda b: f"{b / 2**30:.1f}"
    lines = [f"# Whole model, {args.date}, {merged['gpu']}", "",
             f"{ours.get('shape')} shape, random weights, bf16, batch 1; engine memory plan {ours.get('memory_plan')}, "
             f"prefill chunk {ours.get('chunk_tokens')} tokens. transformers {hf.get('transformers', '?')} "
             f"(attention: {hf.get('attention', '?')}) in the same device call. Copy bandwidth "
             f"{ours.get('copy_bandwidth_gbps', 0):.0f} GB/s (read + write).", "", f"Command: `{args.command}`", "",
             "| prompt tokens | engine prefill (s) | engine tokens/s | transformers prefill (s) | speed-up | "
             "engine GPU memory (GiB) | transformers peak (GiB) |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for e in ours.get("prefill", []):
        h = hf_prefill.get(e["tokens"])
        lines.append(f"| {e['tokens']} | {e['seconds']:.3f} | {e['tokens_per_second']:.0f} | "
                     f"{h['seconds']:.3f} | {h['seconds'] / e['seconds']:.2f}x | " if h else
                     f"| {e['tokens']} | {e['seconds']:.3f} | {e['tokens_per_second']:.0f} | - | - | ")
        lines[-1] += f"{gib(e['gpu_memory_used_bytes'])} | " + (f"{gib(h['peak_gpu_memory_bytes'])} |" if h else "- |")
    lines += ["", "| context | engine decode (ms/token) | floor (ms) | engine / floor | transformers (ms/token) | "
                  "speed-up |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for e in ours.get("decode", []):
        h = hf_decode.get(e["context"])
        lines.append(f"| {e['context']} | {e['median_ms_per_token']:.2f} | {e['floor_ms']:.2f} | "
                     f"{e['ratio_to_floor']:.2f} | " +
                     (f"{h['median_ms_per_token']:.1f} | {h['median_ms_per_token'] / e['median_ms_per_token']:.1f}x |"
                      if h else "- | - |"))
    lines += ["", "Floor: bytes one decode step must read (all weight matrices and the lm_head in bf16, plus the "
                  "K/V cache) over the measured copy bandwidth."]
    open(args.markdown, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
