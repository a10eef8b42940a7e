#!/usr/bin/env python3
"""Writes the FP8 checkpoint fixtures under tests/fixtures/fp8/.

One tiny random Llama (bf16 values) saved by transformers, re-stored once per FP8 format with its projections
quantized by PyTorch (torch.float8_e4m3fn casts, so the rounding is PyTorch's, not the engine's):

  ct_channel_dynamic  compressed-tensors, one scale per output channel, inputs per token at run time
  ct_tensor_static    compressed-tensors, one scale per tensor, calibrated static input scales
  ct_weights_only     compressed-tensors, channel scales, inputs not quantized
  fbgemm_channel      fbgemm_fp8, channel scales, inputs per token with activation_scale_ub

The reference logits are transformers' float32 model with each projection's weight replaced by its
codes times its scales, and (where the format quantizes inputs) a forward pre-hook on each projection
that quantizes the input as the format defines: scale = max|row| / 448 (bounded by
activation_scale_ub, at least 1 / (448 * 512)) or the static input_scale, the largest of q/k/v's and
of gate/up's for the fused products (vLLM's rule), then x / scale clamped to +-448 and cast to E4M3.

Needs torch, transformers, safetensors; no network. Usage:

    python3 scripts/make_fp8_fixtures.py --out tests/fixtures/fp8

expected.json per fixture: case, quantization_config, prompts, last_logits (one row per prompt),
greedy (8 tokens per prompt), top2_margins (of each greedy step), activation_effect (how far the
logits move when the input quantization is left out, relative to the largest), versions.
"""

import argparse
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

FP8_MAX = 448.0
MIN_ACTIVATION_SCALE = 1.0 / (FP8_MAX * 512.0)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
GREEDY_STEPS = 8
FBGEMM_UPPER_BOUND = 3.0  # below some rows' largest input, so that the bound is exercised


def compressed_tensors(weight_strategy, input_activations):
    group = {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": weight_strategy, "symmetric": True,
                    "dynamic": False},
        "input_activations": input_activations,
    }
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": group}}


CASES = {
    "ct_channel_dynamic": dict(
        config=compressed_tensors("channel", {"num_bits": 8, "type": "float", "strategy": "token",
                                              "dynamic": True, "symmetric": True}),
        per_channel=True, inputs="dynamic"),
    "ct_tensor_static": dict(
        config=compressed_tensors("tensor", {"num_bits": 8, "type": "float", "strategy": "tensor",
                                             "dynamic": False, "symmetric": True}),
        per_channel=False, inputs="static"),
    "ct_weights_only": dict(config=compressed_tensors("channel", None), per_channel=True, inputs="none"),
    "fbgemm_channel": dict(
        config={"quant_method": "fbgemm_fp8", "activation_scale_ub": FBGEMM_UPPER_BOUND,
                "modules_to_not_convert": ["lm_head"]},
        per_channel=True, inputs="dynamic", upper_bound=FBGEMM_UPPER_BOUND),
}


def make_model(seed):
    # head_dim 64, as the CUDA kernels need.
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                values = torch.rand(param.shape, generator=generator) * 0.8 + 0.6
            elif "embed_tokens" in name:
                values = torch.randn(param.shape, generator=generator) * 0.6
            else:
                # Small enough that the model is not chaotic: the GPU's bf16 activations then
                # move the logits by bf16 noise, not by a cascade of flipped E4M3 codes.
                values = torch.randn(param.shape, generator=generator) * 0.05
            # bf16 values (stored so, exactly), computed in float32.
            param.copy_(values.to(torch.bfloat16).to(torch.float32))
    return model


def projections(model):
    for index, layer in enumerate(model.model.layers):
        for name in PROJECTIONS:
            parent = layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            yield f"model.layers.{index}.{'self_attn' if parent is layer.self_attn else 'mlp'}.{name}", name, \
                getattr(parent, name)


def quantize_weight(weight, per_channel):
    magnitude = weight.abs().amax(dim=1, keepdim=True) if per_channel else weight.abs().amax().reshape(1)
    scale = (magnitude / FP8_MAX).to(torch.float32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (weight / (scale if per_channel else scale.reshape(1, 1))).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def quantize_input(x, scale):
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale


def greedy(model, prompt):
    tokens, margins = list(prompt), []
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            row = model(torch.tensor([tokens])).logits[0, -1]
            top = torch.topk(row, 2)
            margins.append(float(top.values[0] - top.values[1]))
            tokens.append(int(top.indices[0]))
    return tokens[len(prompt):], margins


def last_logits(model, prompts):
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0, -1].tolist() for p in prompts]


def relative_max_difference(a, b):
    a, b = torch.tensor(a), torch.tensor(b)
    return float((a - b).abs().max() / b.abs().max())


def write_case(name, spec, base_folder, out_root, prompts, calibration):
    model = make_model(seed=7)
    folder = os.path.join(out_root, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    shutil.copy(os.path.join(base_folder, "config.json"), folder)
    tensors = load_file(os.path.join(base_folder, "model.safetensors"))

    # Static input scales: the largest input magnitude of each projection over a calibration
    # prompt, times 0.8 so that some inputs saturate.
    static = {}
    if spec["inputs"] == "static":
        seen = {}
        hooks = [module.register_forward_pre_hook(
            lambda m, args, path=path: seen.__setitem__(path, max(seen.get(path, 0.0), float(args[0].abs().max()))))
            for path, _, module in projections(model)]
        with torch.no_grad():
            model(torch.tensor([calibration]))
        for hook in hooks:
            hook.remove()
        static = {path: seen[path] * 0.8 / FP8_MAX for path in seen}

    with torch.no_grad():
        for path, _, module in projections(model):
            codes, scale = quantize_weight(module.weight.data, spec["per_channel"])
            tensors[path + ".weight"] = codes
            tensors[path + ".weight_scale"] = scale
            if spec["inputs"] == "static":
                tensors[path + ".input_scale"] = torch.tensor([static[path]], dtype=torch.float32)
            module.weight.copy_(codes.to(torch.float32) * (scale if spec["per_channel"] else scale.reshape(1, 1)))
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = spec["config"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    weights_only_logits = last_logits(model, prompts)
    hooks = []
    if spec["inputs"] != "none":
        # The fused products share one static scale: the largest of their parts'.
        shared = dict(static)
        for layer in range(len(model.model.layers)):
            for group in FUSED:
                kind = "self_attn" if group[0] == "q_proj" else "mlp"
                paths = [f"model.layers.{layer}.{kind}.{n}" for n in group]
                if static:
                    largest = max(static[p] for p in paths)
                    for p in paths:
                        shared[p] = largest
        upper_bound = spec.get("upper_bound")

        def hook_for(path):
            def hook(module, args):
                x = args[0]
                if spec["inputs"] == "static":
                    scale = torch.tensor(shared[path], dtype=torch.float32)
                else:
                    magnitude = x.abs().amax(dim=-1, keepdim=True)
                    if upper_bound is not None:
                        magnitude = magnitude.clamp(max=upper_bound)
                    scale = (magnitude / FP8_MAX).clamp(min=MIN_ACTIVATION_SCALE)
                return (quantize_input(x, scale),)
            return hook

        hooks = [module.register_forward_pre_hook(hook_for(path)) for path, _, module in projections(model)]
    logits = last_logits(model, prompts)
    continuations = [greedy(model, p) for p in prompts]
    for hook in hooks:
        hook.remove()
    expected = {
        "case": name,
        "quantization_config": spec["config"],
        "prompts": prompts,
        "last_logits": logits,
        "greedy": [c[0] for c in continuations],
        "top2_margins": [c[1] for c in continuations],
        "activation_effect": max(relative_max_difference(w, l) for w, l in zip(weights_only_logits, logits)),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"{name}: input quantization moves the logits by {expected['activation_effect']:.4f} of the largest; "
          f"smallest greedy margin {min(min(m) for m in expected['top2_margins']):.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, ".base")
    shutil.rmtree(base, ignore_errors=True)
    make_model(seed=7).to(torch.bfloat16).save_pretrained(base, safe_serialization=True)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 256, (n,), generator=generator).tolist() for n in (17, 48)]
    calibration = torch.randint(3, 256, (64,), generator=generator).tolist()
    for name, spec in CASES.items():
        write_case(name, spec, base, args.out, prompts, calibration)
    shutil.rmtree(base)


if __name__ == "__main__":
    main()
