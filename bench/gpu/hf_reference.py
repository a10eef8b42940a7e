#!/usr/bin/env python3
"""transformers (SDPA attention) on the same Llama-3.1-8B-shaped random-weight model the CUDA engine's
model benchmark runs, bf16, batch 1: prefill seconds per prompt length (one forward over the prompt with
a KV cache, keeping only the last token's logits, as generation does) and decode ms/token at given
contexts (greedy steps over the cache filled by a prefill), end to end (model.generate over a prompt
plus a number of greedy tokens, as a user runs it), plus peak GPU memory."""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    shape = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    try:  # transformers 5 names the RoPE settings rope_parameters, earlier versions rope_scaling
        config = LlamaConfig(**shape, rope_parameters={**llama3, "rope_theta": 500000.0})
    except (TypeError, ValueError, KeyError):
        config = LlamaConfig(**shape, rope_theta=500000.0, rope_scaling=llama3)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(previous)
    return model.to(torch.bfloat16).eval()


def prompt(length, seed):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, 128256, (1, length), generator=generator).to("cuda")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefill", default="16384,32768,65536,131072")
    parser.add_argument("--decode-contexts", default="32768,131072")
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--e2e", default="", help="prompt lengths for end-to-end generate() timings")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": transformers.__version__, "attention": "sdpa", "prefill": [], "decode": []}
    start = time.perf_counter()
    model = build_model()
    torch.cuda.synchronize()
    report["load_seconds"] = time.perf_counter() - start
    print(f"transformers {transformers.__version__}: model built in {report['load_seconds']:.1f} s", flush=True)

    with torch.inference_mode():
        model(input_ids=prompt(1024, 0), use_cache=True, logits_to_keep=1)  # warm-up
        torch.cuda.synchronize()
        for length in [int(x) for x in args.prefill.split(",") if x]:
            ids = prompt(length, 2)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            out.logits.argmax(-1).item()
            seconds = time.perf_counter() - start
            report["prefill"].append({"tokens": length, "seconds": seconds, "tokens_per_second": length / seconds,
                                      "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated()})
            print(f"prefill {length}: {seconds:.3f} s, {length / seconds:.0f} tokens/s", flush=True)
            del out
        for context in [int(x) for x in args.decode_contexts.split(",") if x]:
            prefix = context - args.decode_tokens
            torch.cuda.empty_cache()
            out = model(input_ids=prompt(prefix, 3), use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(args.decode_tokens):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token = out.logits[:, -1:].argmax(-1)
                token.item()
                times.append(time.perf_counter() - start)
            times.sort()
            median_ms = 1e3 * times[len(times) // 2]
            report["decode"].append({"context": context, "tokens": args.decode_tokens, "median_ms_per_token": median_ms})
            print(f"decode at {context}: {median_ms:.1f} ms/token", flush=True)
            del out, cache
        for length in [int(x) for x in args.e2e.split(",") if x]:
            ids = prompt(length, 2)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            start = time.perf_counter()
            generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                       do_sample=False, pad_token_id=0, eos_token_id=None)
            generated[0, -1].item()
            seconds = time.perf_counter() - start
            report.setdefault("e2e", []).append({"prompt_tokens": length, "new_tokens": int(generated.shape[1] - length),
                                                 "seconds": seconds,
                                                 "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated()})
            print(f"e2e {length} + {generated.shape[1] - length}: {seconds:.2f} s", flush=True)
            del generated
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
