#!/usr/bin/env python3
"""Merges one FP8 round (scripts/gpu_round.sh, step fp8) into a table against bf16 in the same call.

Inputs: the GEMM benchmark (bf16 and FP8 products at 16k-token chunks and one token), the model
benchmark with bf16 and with FP8 projections (128k prefill, decode at 32k and 128k with their
floors), the method benchmark in both formats (entropy+latent and full at 128k + 256 tokens) and
transformers' bf16 end to end on the same shape. With --model-fp8-cache and --methods-fp8-cache,
the same with FP8 projections and the FP8 KV cache, in a column of its own."""
import argparse
import json


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm", required=True)
    parser.add_argument("--model-bf16", required=True)
    parser.add_argument("--model-fp8", required=True)
    parser.add_argument("--methods-bf16", required=True)
    parser.add_argument("--methods-fp8", required=True)
    parser.add_argument("--hf", required=True)
    parser.add_argument("--model-fp8-cache")
    parser.add_argument("--methods-fp8-cache")
    parser.add_argument("--date", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    args = parser.parse_args()
    gemm, model_bf16, model_fp8 = load(args.gemm), load(args.model_bf16), load(args.model_fp8)
    methods_bf16, methods_fp8, hf = load(args.methods_bf16), load(args.methods_fp8), load(args.hf)
    model_cache = load(args.model_fp8_cache) if args.model_fp8_cache else None
    methods_cache = load(args.methods_fp8_cache) if args.methods_fp8_cache else None
    device = next((d["device"] for d in (gemm, model_bf16, model_fp8) if d), "unknown GPU")
    summary = {"date": args.date, "device": device, "command": args.command}
    lines = [f"# FP8 against bf16, {args.date}, {device}", "", f"`{args.command}`", "",
             "Llama-3.1-8B shape, random weights (FP8: every projection quantized per output row, "
             "inputs per token at run time; the classifier stays bf16). Everything below ran in one "
             "device call.", ""]

    if gemm:
        lines += ["## Products", "", "| tokens | product | bf16 ms | FP8 ms | FP8 speedup |", "|---|---|---|---|---|"]
        rows = gemm.get("results", [])
        products = []
        for r in rows:
            key = (r["tokens"], r["product"])
            if key not in products:
                products.append(key)
        summary["products"] = []
        for tokens, product in products:
            engine_kernel = "gemv" if tokens == 1 else "cublaslt"
            fp8_kernel = "fp8-gemv" if tokens == 1 else "fp8-cublaslt"
            bf16 = next((r for r in rows if (r["tokens"], r["product"], r["kernel"]) == (tokens, product, engine_kernel)), None)
            fp8 = next((r for r in rows if (r["tokens"], r["product"], r["kernel"]) == (tokens, product, fp8_kernel)), None)
            if not bf16 or not fp8:
                continue
            speedup = bf16["median_ms"] / fp8["median_ms"]
            summary["products"].append({"tokens": tokens, "product": product, "bf16_ms": bf16["median_ms"],
                                        "fp8_ms": fp8["median_ms"], "speedup": speedup})
            lines.append(f"| {tokens} | {product} | {bf16['median_ms']:.4f} | {fp8['median_ms']:.4f} | {speedup:.2f}x |")
        for entry in gemm.get("prompt_seconds", []):
            if "fp8_seconds" in entry:
                lines.append("")
                lines.append(f"At {entry['tokens']}-token chunks the four products of a 128k-token prompt take "
                             f"{entry['seconds']:.2f} s in bf16 and {entry['fp8_seconds']:.2f} s in FP8 "
                             f"(**{entry['fp8_speedup']:.2f}x**; FP8 includes quantizing each input).")
                summary.setdefault("prompt_products", []).append(entry)
        lines.append("")

    if model_bf16 and model_fp8:
        cache_columns = " | FP8 + FP8 cache | its speedup | its floor ratio" if model_cache else ""
        lines += ["## Whole model", "", f"| | bf16 | FP8 | FP8 speedup | FP8 / its floor{cache_columns} |",
                  "|---|---|---|---|---" + ("|---|---|---" if model_cache else "") + "|"]
        summary["prefill"], summary["decode"] = [], []
        fp8_prefill = {r["tokens"]: r for r in model_fp8.get("prefill", [])}
        cache_prefill = {r["tokens"]: r for r in (model_cache or {}).get("prefill", [])}
        for r in model_bf16.get("prefill", []):
            f = fp8_prefill.get(r["tokens"])
            if f:
                speedup = r["seconds"] / f["seconds"]
                entry = {"tokens": r["tokens"], "bf16_s": r["seconds"], "fp8_s": f["seconds"], "speedup": speedup}
                extra = ""
                c = cache_prefill.get(r["tokens"])
                if c:
                    entry.update({"fp8_cache_s": c["seconds"], "fp8_cache_speedup": r["seconds"] / c["seconds"]})
                    extra = f" | {c['seconds']:.2f} s | {entry['fp8_cache_speedup']:.2f}x | "
                summary["prefill"].append(entry)
                lines.append(f"| prefill {r['tokens']} (full attention) | {r['seconds']:.2f} s | {f['seconds']:.2f} s | {speedup:.2f}x | {extra}|")
        fp8_decode = {r["context"]: r for r in model_fp8.get("decode", [])}
        cache_decode = {r["context"]: r for r in (model_cache or {}).get("decode", [])}
        for r in model_bf16.get("decode", []):
            f = fp8_decode.get(r["context"])
            if f:
                speedup = r["median_ms_per_token"] / f["median_ms_per_token"]
                entry = {"context": r["context"], "bf16_ms": r["median_ms_per_token"],
                         "fp8_ms": f["median_ms_per_token"], "speedup": speedup,
                         "fp8_floor_ms": f["floor_ms"], "fp8_ratio_to_floor": f["ratio_to_floor"],
                         "bf16_ratio_to_floor": r["ratio_to_floor"]}
                extra = ""
                c = cache_decode.get(r["context"])
                if c:
                    entry.update({"fp8_cache_ms": c["median_ms_per_token"],
                                  "fp8_cache_speedup": r["median_ms_per_token"] / c["median_ms_per_token"],
                                  "fp8_cache_floor_ms": c["floor_ms"], "fp8_cache_ratio_to_floor": c["ratio_to_floor"]})
                    extra = (f" | {c['median_ms_per_token']:.2f} ms | **{entry['fp8_cache_speedup']:.2f}x** | "
                             f"{c['ratio_to_floor']:.2f}x of {c['floor_ms']:.2f} ms")
                summary["decode"].append(entry)
                lines.append(f"| decode at {r['context']} | {r['median_ms_per_token']:.2f} ms | {f['median_ms_per_token']:.2f} ms | "
                             f"{speedup:.2f}x | {f['ratio_to_floor']:.2f}x of {f['floor_ms']:.2f} ms{extra} |")
        lines += ["", "Decode floors: the weights (FP8: a byte per projection weight and a float per row, "
                  "the classifier in bf16) and the whole cache (FP8 cache: a byte per element and a float "
                  "per row of each head) read once at the copy bandwidth measured in the same run.", ""]

    if methods_bf16 and methods_fp8:
        cache_header = " | FP8 + FP8 cache s | its speedup | vs transformers bf16" if methods_cache else ""
        lines += ["## End to end (prompt + 256 generated tokens)", "",
                  f"| method | prompt | bf16 s | FP8 s | FP8 speedup | vs transformers bf16{cache_header} |",
                  "|---|---|---|---|---|---" + ("|---|---|---" if methods_cache else "") + "|"]
        hf_e2e = {r["prompt_tokens"]: r for r in (hf or {}).get("e2e", [])}
        fp8_rows = {(r["method"], r["prompt_tokens"]): r for r in methods_fp8.get("results", [])}
        cache_rows = {(r["method"], r["prompt_tokens"]): r for r in (methods_cache or {}).get("results", [])}
        summary["e2e"] = []
        for r in methods_bf16.get("results", []):
            f = fp8_rows.get((r["method"], r["prompt_tokens"]))
            if not f:
                continue
            reference = hf_e2e.get(r["prompt_tokens"])
            entry = {"method": r["method"], "prompt_tokens": r["prompt_tokens"], "bf16_s": r["e2e_seconds_median"],
                     "fp8_s": f["e2e_seconds_median"], "speedup": r["e2e_seconds_median"] / f["e2e_seconds_median"]}
            versus = ""
            if reference:
                entry["transformers_bf16_s"] = reference["seconds"]
                entry["fp8_vs_transformers"] = reference["seconds"] / f["e2e_seconds_median"]
                entry["bf16_vs_transformers"] = reference["seconds"] / r["e2e_seconds_median"]
                versus = f"bf16 {entry['bf16_vs_transformers']:.2f}x, FP8 **{entry['fp8_vs_transformers']:.2f}x** (of {reference['seconds']:.1f} s)"
            extra = ""
            c = cache_rows.get((r["method"], r["prompt_tokens"]))
            if c:
                entry["fp8_cache_s"] = c["e2e_seconds_median"]
                entry["fp8_cache_speedup"] = r["e2e_seconds_median"] / c["e2e_seconds_median"]
                extra = f" | {c['e2e_seconds_median']:.2f} | {entry['fp8_cache_speedup']:.2f}x | "
                if reference:
                    entry["fp8_cache_vs_transformers"] = reference["seconds"] / c["e2e_seconds_median"]
                    extra += f"**{entry['fp8_cache_vs_transformers']:.2f}x**"
            summary["e2e"].append(entry)
            lines.append(f"| {r['method']} | {r['prompt_tokens']} | {entry['bf16_s']:.2f} | {entry['fp8_s']:.2f} | "
                         f"{entry['speedup']:.2f}x | {versus}{extra} |")
        lines.append("")

    with open(args.json, "w") as f:
        json.dump(summary, f, indent=2)
    with open(args.markdown, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
