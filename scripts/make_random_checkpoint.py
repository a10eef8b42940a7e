#!/usr/bin/env python3
"""Writes a Hugging Face Llama folder of a real model's shape with random bf16 weights, using only
the standard library, for measuring loads and decode speed where torch is not installed.

  scripts/make_random_checkpoint.py OUT_DIR [--shape llama-3.1-8b|llama-1b] [--shards 4]
                                    [--tokenizer tokenizer.json]

Weights are bf16 values of magnitude 2^-7 to 2^-6 with random signs and mantissas (norm weights are
1.0), so activations stay finite through every layer; random bytes would hold NaNs and infinities.
The data are one random block repeated at shifting offsets, which is enough for timing. The shards
and model.safetensors.index.json follow transformers' save_pretrained layout.
"""
import argparse
import json
import os
import shutil
import struct
import sys

SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0,
                         rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192,
                                       "rope_type": "llama3"}),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=None),
}
BLOCK_BYTES = 1 << 24


def random_block():
    block = bytearray(os.urandom(BLOCK_BYTES))
    # Little-endian bf16: the odd byte holds the sign and the exponent's top seven bits. 0x3C / 0xBC
    # give exponents 2^-7 and 2^-6 (by the even byte's top bit), with either sign.
    table = bytes((0xBC if value & 1 else 0x3C) for value in range(256))
    block[1::2] = bytes(block[1::2]).translate(table)
    return bytes(block)


def tensors_of(config):
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    vocab = config["vocab_size"]
    yield "model.embed_tokens.weight", [vocab, hidden]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        yield prefix + "input_layernorm.weight", [hidden]
        yield prefix + "self_attn.q_proj.weight", [heads * head_dim, hidden]
        yield prefix + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden]
        yield prefix + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden]
        yield prefix + "self_attn.o_proj.weight", [hidden, heads * head_dim]
        yield prefix + "post_attention_layernorm.weight", [hidden]
        yield prefix + "mlp.gate_proj.weight", [inter, hidden]
        yield prefix + "mlp.up_proj.weight", [inter, hidden]
        yield prefix + "mlp.down_proj.weight", [hidden, inter]
    yield "model.norm.weight", [hidden]
    yield "lm_head.weight", [vocab, hidden]


def numel(shape):
    count = 1
    for extent in shape:
        count *= extent
    return count


def write_shard(path, tensors, block):
    header, offset = {}, 0
    for name, shape in tensors:
        size = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    one_bf16 = b"\x80\x3f"  # bf16 1.0, little-endian
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        shift = 0
        for name, shape in tensors:
            size = 2 * numel(shape)
            if len(shape) == 1:
                out.write(one_bf16 * numel(shape))
                continue
            written = 0
            while written < size:
                start = shift % (BLOCK_BYTES // 2) * 2
                piece = min(size - written, BLOCK_BYTES - start)
                out.write(block[start:start + piece])
                written += piece
                shift += 4099
    return offset


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--tokenizer", help="a tokenizer.json to copy beside the weights")
    args = parser.parse_args()
    if args.shards < 1:
        parser.error("--shards must be at least 1")

    config = dict(SHAPES[args.shape])
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                  rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="bfloat16",
                  bos_token_id=128000, eos_token_id=128001, attention_bias=False,
                  mlp_bias=False, head_dim=config["hidden_size"] // config["num_attention_heads"])
    tensors = list(tensors_of(config))
    total = sum(2 * numel(shape) for _, shape in tensors)
    # Shards of about equal bytes, split between tensors, as save_pretrained's max_shard_size does.
    shards, current, current_bytes = [], [], 0
    target = total / args.shards
    for name, shape in tensors:
        size = 2 * numel(shape)
        if current and current_bytes + size > target and len(shards) < args.shards - 1:
            shards.append(current)
            current, current_bytes = [], 0
        current.append((name, shape))
        current_bytes += size
    shards.append(current)

    os.makedirs(args.out_dir, exist_ok=True)
    block = random_block()
    weight_map = {}
    for index, shard in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(args.out_dir, file_name), shard, block)
        for name, _ in shard:
            weight_map[name] = file_name
        print(f"wrote {file_name} ({len(shard)} tensors)", file=sys.stderr)
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as out:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, out, indent=2)
    with open(os.path.join(args.out_dir, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
    if args.tokenizer:
        shutil.copy(args.tokenizer, os.path.join(args.out_dir, "tokenizer.json"))
    print(f"{args.out_dir}: {args.shape}, {total / 2**30:.2f} GiB of bf16 in {len(shards)} shards",
          file=sys.stderr)


if __name__ == "__main__":
    main()
