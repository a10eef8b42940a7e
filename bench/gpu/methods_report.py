#!/usr/bin/env python3
"""Joins `entropyinfer bench --device cuda` results (the engine under each attention method) with the
transformers reference run in the same device call (hf_reference.py --e2e), and states the ratios the
sparse methods are judged by: prefill and end-to-end speed-up over the engine's own full attention and
over transformers, the estimate's share of the sparse prefill, decode against its memory floor."""
import argparse
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--hf", default="")
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    ours = json.load(open(args.ours))
    hf = json.load(open(args.hf)) if args.hf else {}
    hf_e2e = {row["prompt_tokens"]: row for row in hf.get("e2e", [])}
    hf_prefill = {row["tokens"]: row for row in hf.get("prefill", [])}
    rows = ours["results"]
    full = {r["prompt_tokens"]: r for r in rows if r["method"].split("+")[0].split("@")[0] == "full"
            and "@" not in r["method"]}
    lines = []
    summary = []
    for r in rows:
        n = r["prompt_tokens"]
        base = full.get(n)
        entry = {"prompt_tokens": n, "method": r["method"], "prefill_s": r["prefill_seconds_median"],
                 "e2e_s": r["e2e_seconds_median"], "keys_fraction": r["prefill_keys_fraction"]}
        if base:
            entry["prefill_speedup_vs_full"] = base["prefill_seconds_median"] / r["prefill_seconds_median"]
            entry["e2e_speedup_vs_full"] = base["e2e_seconds_median"] / r["e2e_seconds_median"]
        if n in hf_e2e:
            entry["e2e_speedup_vs_transformers"] = hf_e2e[n]["seconds"] / r["e2e_seconds_median"]
        if n in hf_prefill:
            entry["prefill_speedup_vs_transformers"] = hf_prefill[n]["seconds"] / r["prefill_seconds_median"]
        if r["estimate_ms"] > 0:
            entry["estimate_share_of_prefill"] = r["estimate_ms"] / (1e3 * r["prefill_seconds_median"])
        entry["decode_ratio_to_floor"] = r["decode_ratio_to_floor"]
        summary.append(entry)

    def fmt(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    lines.append(f"# Attention methods on the GPU: {ours['device']}, {ours['date']}\n")
    lines.append(f"Engine: `{ours['command']}`; {ours['model']}, copy bandwidth "
                 f"{ours['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s.")
    if hf:
        lines.append(f"Reference in the same device call: transformers {hf.get('transformers')} (SDPA), "
                     f"torch {hf.get('torch')}, `model.generate` greedy, same shapes.\n")
    lines.append(ours["markdown"])
    lines.append("\n| prompt | method | keys read | prefill x full | e2e x full | prefill x transformers | "
                 "e2e x transformers | estimate / prefill | decode / floor |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for e in summary:
        lines.append(f"| {e['prompt_tokens']} | {e['method']} | {e['keys_fraction']:.3f} | "
                     f"{fmt(e.get('prefill_speedup_vs_full'))} | {fmt(e.get('e2e_speedup_vs_full'))} | "
                     f"{fmt(e.get('prefill_speedup_vs_transformers'))} | {fmt(e.get('e2e_speedup_vs_transformers'))} | "
                     f"{fmt(e.get('estimate_share_of_prefill'), 3)} | {fmt(e['decode_ratio_to_floor'])} |")
    staged = [r for r in rows if r.get("prefill_stage_ms")]
    if staged:
        # One more prefill per row, timed part by part with CUDA events (entropyinfer bench
        # --stage-times); the parts' sum is GPU time, a little over the untimed prefill.
        stages = []
        for r in staged:
            stages += [name for name in r["prefill_stage_ms"] if name not in stages]
        lines.append("\nPrefill GPU time by part (ms), from one more prefill per row with events "
                     "around each part:\n")
        lines.append("| prompt | method | " + " | ".join(stages) + " | sum |")
        lines.append("|---|---|" + "---|" * (len(stages) + 1))
        for r in staged:
            parts = r["prefill_stage_ms"]
            lines.append(f"| {r['prompt_tokens']} | {r['method']} | " +
                         " | ".join(f"{parts[name]:.0f}" if name in parts else "-" for name in stages) +
                         f" | {sum(parts.values()):.0f} |")
    if hf:
        lines.append("\ntransformers: " + "; ".join(
            f"prefill {n}: {row['seconds']:.2f} s" for n, row in sorted(hf_prefill.items())) + "; " + "; ".join(
            f"e2e {n} + {row['new_tokens']}: {row['seconds']:.2f} s" for n, row in sorted(hf_e2e.items())))
    open(args.markdown, "w").write("\n".join(lines) + "\n")
    json.dump({"engine": ours, "transformers": hf, "summary": summary}, open(args.json, "w"), indent=2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
