#!/usr/bin/env python3
"""Makes a user's real-size checkpoint with transformers on the GPU: LlamaForCausalLM of the
Llama-3.1-8B shape with random weights, cast to bf16 and saved by save_pretrained in 5 GB shards
(4 files, 16 GB), a real tokenizer.json beside it; and, with --prompt-file, a prompt of exactly
--prompt-tokens tokens (BOS included) under that tokenizer.

  make_hf_checkpoint.py --out DIR --tokenizer tokenizer.json [--prompt-file F --prompt-tokens N]
"""
import argparse
import json
import os
import random
import shutil
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

WORDS = ("harbour ledger north south pier barrels salt river lantern keeper morning tide crates "
         "rope anchor captain sailed evening storm quiet village market wool grain bridge mill "
         "winter summer letter friend journey mountain forest road stone window garden").split()


def content_ids(tokenizer, text):
    encoding = tokenizer.encode(text)
    return [i for i, special in zip(encoding.ids, encoding.special_tokens_mask) if not special]


def make_prompt(tokenizer, tokens, path):
    """Numbered sentences cut to `tokens` tokens with the BOS the engine prepends."""
    rng = random.Random(0)
    sentences = [f"Entry {n}: the {rng.choice(WORDS)} {rng.choice(WORDS)} of the "
                 f"{rng.choice(WORDS)} was {rng.randint(2, 9999)}." for n in range(tokens // 8)]
    ids = content_ids(tokenizer, " ".join(sentences))
    assert len(ids) > tokens, "not enough text"
    keep = tokens - 1
    # A cut can merge differently when encoded again; shorten until it fits.
    while True:
        text = tokenizer.decode(ids[:keep])
        count = len(content_ids(tokenizer, text))
        if count <= tokens - 1:
            break
        keep -= count - (tokens - 1)
    with open(path, "w") as out:
        out.write(text)
    return count + 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--prompt-file")
    parser.add_argument("--prompt-tokens", type=int, default=130816)
    args = parser.parse_args()

    start = time.time()
    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                         rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192,
                                       "rope_type": "llama3"},
                         bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out, max_shard_size="5GB")
    shutil.copy(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    shards = sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in shards)
    result = {"folder": args.out, "shards": len(shards), "bytes": size,
              "seconds": round(time.time() - start, 1)}
    if args.prompt_file:
        tokenizer = Tokenizer.from_file(args.tokenizer)
        result["prompt_tokens_with_bos"] = make_prompt(tokenizer, args.prompt_tokens,
                                                          args.prompt_file)
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
