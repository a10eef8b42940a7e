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
    python3 scripts/make_fp8_fixtures.py --out tests/fixtures/fp8 --only kv_cache_fp8

expected.json per fixture: case, quantization_config, prompts, last_logits (one row per prompt),
greedy (8 tokens per prompt), top2_margins (of each greedy step), activation_effect (how far the
logits move when the input quantization is left out, relative to the largest), versions.

kv_cache_fp8/expected_kv_cache.json: the FP8 KV cache's reference (EngineOptions::fp8_kv_cache) on
ct_weights_only's checkpoint as stored (its codes times its scales, computed in float32). Every row
transformers caches (one token's key, after RoPE, or value, of one KV head) is replaced before it is
stored by its float8_e4m3fn round trip with scale = max|row| / 448 (1 for an all-zero row): x / scale
clamped to +-448, cast, cast back, times the scale. The prompt's attention reads those rows, its own
included, and so does every decode step. Fields: model (the checkpoint's folder), prompts, fed (per
prompt, the tokens fed one at a time after it: the FP8-cache model's greedy ones), logits (per
prompt, the prompt's last-position logits and then each fed token's), kv_effect (how far the FP8
cache moves those logits from the plain cache's, relative to the largest), versions.
"""

import argparse
import contextlib
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, cache_utils

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


KV_CACHE_CASE = "kv_cache_fp8"
KV_CACHE_MODEL = "ct_weights_only"  # the plainest format: the projections' inputs as they are
KV_CACHE_STEPS = 8


def fp8_kv_round_trip(x):
    """Each row of the last dimension through E4M3 with its own scale (core/fp8.h's KV rule)."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


class Fp8KvCache:
    """While entered, every DynamicLayer stores (and attention reads) the round-tripped rows."""

    def __enter__(self):
        self.calls = 0
        self.original = cache_utils.DynamicLayer.update

        def update(layer, key_states, value_states, *args, **kwargs):
            self.calls += 1
            return self.original(layer, fp8_kv_round_trip(key_states), fp8_kv_round_trip(value_states),
                                 *args, **kwargs)

        cache_utils.DynamicLayer.update = update
        return self

    def __exit__(self, *exc):
        cache_utils.DynamicLayer.update = self.original


def stored_model(folder):
    """The checkpoint in `folder` as a float32 transformers model: codes times scales, as stored."""
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    model = make_model(seed=7)
    state = {}
    for name in model.state_dict():
        scale_name = name[:-len("weight")] + "weight_scale"
        if scale_name in tensors:
            state[name] = tensors[name].to(torch.float32) * tensors[scale_name]
        else:
            state[name] = tensors[name].to(torch.float32)
    model.load_state_dict(state, strict=True)
    return model


def fed_logits(model, prompt, fed, fp8_cache):
    """The prompt's last logits, then each fed token's, through transformers' cache; with fed None,
    the model's own greedy tokens are fed and returned."""
    rows, tokens = [], []
    with torch.no_grad():
        context = Fp8KvCache() if fp8_cache else contextlib.nullcontext()
        with context as patch:
            out = model(torch.tensor([prompt]), use_cache=True)
            rows.append(out.logits[0, -1])
            for step in range(KV_CACHE_STEPS):
                token = int(rows[-1].argmax()) if fed is None else fed[step]
                tokens.append(token)
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
                rows.append(out.logits[0, -1])
        if fp8_cache:
            layers = len(model.model.layers)
            assert patch.calls == layers * (KV_CACHE_STEPS + 1), \
                f"the FP8 cache saw {patch.calls} updates, not {layers * (KV_CACHE_STEPS + 1)}"
    return [r.tolist() for r in rows], tokens


def write_kv_cache_case(out_root, prompts):
    model = stored_model(os.path.join(out_root, KV_CACHE_MODEL)).eval()
    folder = os.path.join(out_root, KV_CACHE_CASE)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    logits, fed, effect = [], [], 0.0
    for prompt in prompts:
        rows, tokens = fed_logits(model, prompt, None, fp8_cache=True)
        plain, _ = fed_logits(model, prompt, tokens, fp8_cache=False)
        effect = max(effect, max(relative_max_difference(p, r) for p, r in zip(plain, rows)))
        logits.append(rows)
        fed.append(tokens)
    expected = {
        "case": KV_CACHE_CASE,
        "model": KV_CACHE_MODEL,
        "prompts": prompts,
        "fed": fed,
        "logits": logits,
        "kv_effect": effect,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(folder, "expected_kv_cache.json"), "w") as f:
        json.dump(expected, f)
    print(f"{KV_CACHE_CASE}: the FP8 cache moves {KV_CACHE_MODEL}'s logits by {effect:.4f} of the largest",
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=[*CASES, KV_CACHE_CASE],
                        help="write this fixture alone (kv_cache_fp8 reads ct_weights_only as stored)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 256, (n,), generator=generator).tolist() for n in (17, 48)]
    calibration = torch.randint(3, 256, (64,), generator=generator).tolist()
    cases = [name for name in CASES if args.only in (None, name)]
    if cases:
        base = os.path.join(args.out, ".base")
        shutil.rmtree(base, ignore_errors=True)
        make_model(seed=7).to(torch.bfloat16).save_pretrained(base, safe_serialization=True)
        for name in cases:
            write_case(name, CASES[name], base, args.out, prompts, calibration)
        shutil.rmtree(base)
    if args.only in (None, KV_CACHE_CASE):
        write_kv_cache_case(args.out, prompts)


if __name__ == "__main__":
    main()
