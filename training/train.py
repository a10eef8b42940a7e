#!/usr/bin/env python3
"""Train EntropyInfer's small long-context Llama in one call on one GPU, export it, evaluate it.

One run: train a byte-level BPE tokenizer on the training text (or reuse the one of the run it
resumes), choose the single-token word pools of the synthetic tasks (training/tasks.py), train a
Llama (GQA, RoPE) on text with tasks embedded in it along a curriculum from short to long
sequences, stopping by wall clock; checkpoint about every minute as an ordinary Hugging Face model
folder; then export, evaluate (single-needle retrieval up to 32k tokens with full attention, the
other tasks at 8k), check the folder with transformers, and write a model card.

Outputs under --out, few flat files because the GPU machine returns at most 8 files of 16 MiB:
  model.tar.00, model.tar.01, ...  the model folder as one tar cut into parts of at most 15 MiB
                    (`cat model.tar.* | tar -x` gives model/: config.json, model.safetensors,
                    tokenizer.json, tokenizer_config.json, task_words.json, README.md); rewritten
                    at every checkpoint
  train_state.json  what resuming needs besides the weights (steps, schedule, elapsed time)
  eval.json         scores, training summary, checks
  eval_manifest.jsonl  one line per evaluation sample: seed, prompt tokens, answers, prompt hash
The model folder is built in --work-dir (default: a new folder under /tmp); --export-folder copies
it somewhere as well. Resume with --resume-from PREVIOUS_OUT (a folder with model.tar.* and
train_state.json, or a model folder): an unfinished schedule continues, a finished one starts a
continuation schedule. See training/README.md.
"""

import argparse
import collections
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import queue
import shutil
import struct
import sys
import tarfile
import tempfile
import time
import traceback

SCRIPT_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tasks  # noqa: E402

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
# LENGTH:FRACTION:BATCH[:MIX[:GATE]]. MIX names a training mixture of tasks.py (default "all");
# GATE: the stage is extended (by at most GATE_MAX_EXTENSION of the schedule) until the answer
# accuracy of the last log window reaches it. Round 1 (all seven families from step 0, the 256-token
# stage 10% long) never learnt to copy: the model must learn single-token retrieval on short
# sequences full of needles ("copy") before anything else, and must not leave them before it has.
FRESH_CURRICULUM = ("256:0.05:128:one:0.5,256:0.10:128:copy:0.5,1024:0.12:48:niah,4096:0.16:16:niah,8192:0.16:8:all,"
                    "16384:0.29:4:all,32768:0.12:2:all")
CONTINUATION_CURRICULUM = "4096:0.15:16:niah,16384:0.55:4:all,32768:0.30:2:all"
GATE_MAX_EXTENSION = 0.15
MAX_MODEL_MB = 50.0
# Answer-word tokens carry their task family in the kind: ANSWER_WORD_BASE + family index, so the
# log can show what each family has learnt.
FAMILIES = ["niah", "niah_match", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "niah_recall", "niah_pairs"]
FAMILY_SHORT = ["niah", "match", "mv", "mq", "vt", "cwe", "fwe", "recall", "pairs"]
ANSWER_WORD_BASE = 10


def log(message):
    print(f"[{time.time() - SCRIPT_START:7.1f}s] {message}", flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (flat: model.tar.NN, eval.json, train_state.json)")
    p.add_argument("--work-dir", default=None, help="where the model folder is built (default: new folder in /tmp)")
    p.add_argument("--export-folder", default=None, help="also copy the final model folder here")
    p.add_argument("--bundle-part-mib", type=float, default=15.0, help="size of each model.tar.NN part")
    p.add_argument("--text-dir", default=None, help="default .cache/assets-text, else ../shared/assets/text")
    p.add_argument("--ruler-dir", default=None, help="default TEXT_DIR/ruler, else ../shared/assets/ruler")
    p.add_argument("--resume-from", default=None, help="a previous --out folder (or its model/ folder)")
    # Time.
    p.add_argument("--train-seconds", type=float, default=390.0, help="training wall-clock budget")
    p.add_argument("--deadline-seconds", type=float, default=540.0,
                   help="the whole script should end by then: training stops early to keep --eval-reserve-seconds")
    p.add_argument("--eval-reserve-seconds", type=float, default=75.0)
    p.add_argument("--checkpoint-seconds", type=float, default=60.0)
    p.add_argument("--log-seconds", type=float, default=5.0)
    # Model (ignored when resuming: the checkpoint's config.json decides).
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--max-position", type=int, default=32768)
    p.add_argument("--export-dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="dtype of model.safetensors; with bfloat16 the weights are rounded before the final "
                   "evaluation, so that it measures exactly the exported model")
    # Optimisation.
    p.add_argument("--curriculum", default=None,
                   help="LENGTH:FRACTION:BATCH,... fractions of the training time "
                   f"(fresh default {FRESH_CURRICULUM}; continuation default {CONTINUATION_CURRICULUM})")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (fresh 2e-3, continuation 1e-3)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--lm-weight", type=float, default=1.0, help="weight of the mean loss on text tokens")
    p.add_argument("--answer-weight", type=float, default=1.0, help="weight of the mean loss on answer words")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train-words", choices=["train", "all"], default="train",
                   help="word pools of the training tasks: without the held-out words (default), or all of them; "
                        "with 'all' the held-out-words evaluation no longer measures unseen words")
    p.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 4) - 4)),
                   help="processes making training batches")
    p.add_argument("--eval-workers", type=int, default=3, help="processes making evaluation samples meanwhile")
    # Evaluation.
    p.add_argument("--eval-samples", type=int, default=50)
    p.add_argument("--eval-single-lengths", default="1024,4096,8192,16384,32768")
    p.add_argument("--eval-other-length", type=int, default=8192)
    p.add_argument("--eval-seed", type=int, default=0)
    p.add_argument("--eval-only", action="store_true", help="no training: evaluate --resume-from")
    p.add_argument("--no-hf-check", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def parse_curriculum(text):
    stages = []
    for part in text.split(","):
        fields = part.split(":")
        if not 3 <= len(fields) <= 5:
            raise ValueError(f"curriculum stage {part!r}: expected LENGTH:FRACTION:BATCH[:MIX[:GATE]]")
        mix = fields[3] if len(fields) > 3 and fields[3] else "all"
        if mix not in tasks.TRAIN_MIXES:
            raise ValueError(f"curriculum stage {part!r}: unknown mixture {mix!r} (known: {', '.join(tasks.TRAIN_MIXES)})")
        stages.append({"length": int(fields[0]), "fraction": float(fields[1]), "batch": int(fields[2]), "mix": mix,
                       "gate": float(fields[4]) if len(fields) > 4 else None})
    total = sum(s["fraction"] for s in stages)
    end = 0.0
    for s in stages:
        end += s["fraction"] / total
        s["end"] = end
    stages[-1]["end"] = 1.0
    return stages


def first_existing(*paths):
    for path in paths:
        if path and os.path.exists(path):
            return path
    return None


# ----------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(lines, vocab_size, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def chunks():
        for i in range(0, len(lines), 2000):
            yield "\n".join(lines[i : i + 2000]) + "\n"

    tokenizer.train_from_iterator(chunks(), trainer=trainer)
    bos = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1", special_tokens=[(BOS_TOKEN, bos)]
    )
    tokenizer.save(path)
    return tokenizer


def write_tokenizer_config(path, max_length):
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    write_json(path, config)


def load_tokenizer(path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------------------------
# Files


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}


def save_safetensors(tensors, path):
    """The safetensors format, written directly: 8-byte little-endian header size, JSON header
    (padded with spaces to 8 bytes so that float32 data can be mapped in place), data."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            data = tensor.view(torch.int16).numpy().tobytes()
        else:
            data = tensor.numpy().tobytes()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-(8 + len(header_bytes)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)))
        handle.write(header_bytes)
        for data in blobs:
            handle.write(data)
    os.replace(tmp, path)


def load_safetensors(path):
    with open(path, "rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
        data = handle.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[begin:end])
        if info["dtype"] == "F32":
            tensor = torch.frombuffer(raw, dtype=torch.float32)
        elif info["dtype"] == "BF16":
            tensor = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float()
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        tensors[name] = tensor.reshape(info["shape"]).clone()
    return tensors


# ----------------------------------------------------------------------------------------------
# Model: Llama with GQA and RoPE, parameter names as transformers' LlamaForCausalLM.


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention(q, k, v, causal):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # torch < 2 (local tests only): the same function, materialised.
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        t, s = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        hidden = cfg["hidden"]
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, layer_cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if layer_cache is not None:
            if layer_cache[0] is not None:
                if t != 1:
                    raise ValueError("the cache takes one token at a time after the prompt")
                k = torch.cat([layer_cache[0], k], dim=2)
                v = torch.cat([layer_cache[1], v], dim=2)
            layer_cache[0], layer_cache[1] = k, v
        repeat = self.heads // self.kv_heads  # query head h reads KV head h // repeat, as transformers
        y = attention(q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1), causal=t > 1)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg["hidden"], cfg["intermediate"], bias=False)
        self.up_proj = nn.Linear(cfg["hidden"], cfg["intermediate"], bias=False)
        self.down_proj = nn.Linear(cfg["intermediate"], cfg["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden"], cfg["rms_norm_eps"])
        self.mlp = Mlp(cfg)

    def forward(self, x, cos, sin, layer_cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["hidden"], cfg["rms_norm_eps"])


class Cache:
    def __init__(self, layers):
        self.layers = [[None, None] for _ in range(layers)]
        self.length = 0


class CausalLM(nn.Module):
    """state_dict() names are LlamaForCausalLM's; the classifier is the embedding (tied)."""

    def __init__(self, cfg, table_length):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        head_dim = cfg["head_dim"]
        # transformers' default RoPE: inv_freq = 1 / theta^(2i/d), cos/sin of cat(freqs, freqs).
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(table_length, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def init_weights(self):
        depth_scale = 1.0 / math.sqrt(2 * self.cfg["layers"])
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(param, std=0.02 * depth_scale)
            else:
                nn.init.normal_(param, std=0.02)

    def forward(self, ids, cache=None, last_only=False):
        t = ids.shape[1]
        start = cache.length if cache is not None else 0
        if start + t > self.rope_cos.shape[0]:
            raise ValueError(f"position {start + t} beyond the RoPE table ({self.rope_cos.shape[0]})")
        cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        h = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, None if cache is None else cache.layers[i])
        if cache is not None:
            cache.length += t
        h = self.model.norm(h)
        if last_only:
            h = h[:, -1:, :]
        return F.linear(h, self.model.embed_tokens.weight)


def model_config_from_args(args, vocab):
    return {
        "vocab": vocab,
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "intermediate": args.intermediate,
        "rope_theta": float(args.rope_theta),
        "max_position": args.max_position,
        "rms_norm_eps": 1e-5,
    }


def model_config_from_hf(hf):
    return {
        "vocab": hf["vocab_size"],
        "hidden": hf["hidden_size"],
        "layers": hf["num_hidden_layers"],
        "heads": hf["num_attention_heads"],
        "kv_heads": hf["num_key_value_heads"],
        "head_dim": hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
        "intermediate": hf["intermediate_size"],
        "rope_theta": float(hf["rope_theta"]),
        "max_position": hf["max_position_embeddings"],
        "rms_norm_eps": hf["rms_norm_eps"],
    }


def hf_config(cfg, bos_id, eos_id, dtype_name):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["hidden"],
        "intermediate_size": cfg["intermediate"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": cfg["max_position"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "use_cache": True,
        "torch_dtype": dtype_name,
    }


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def save_model(model, folder, bos_id, eos_id, dtype_name):
    dtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
    tensors = {name: p.detach().to(dtype) for name, p in model.state_dict().items()}
    save_safetensors(tensors, os.path.join(folder, "model.safetensors"))
    write_json(os.path.join(folder, "config.json"), hf_config(model.cfg, bos_id, eos_id, dtype_name))


# ----------------------------------------------------------------------------------------------
# Data workers (forked before CUDA starts; each loads the tokenizer and text once).

_WORKER = {}


def worker_init():
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def eval_worker_init():
    """The evaluation pool prepares its 600 prompts (most at 8k-32k tokens) while training runs;
    at a lower priority it cannot take CPU time from the training workers (12 + 3 workers and
    the main process share the GPU machine's 16 cores). Its prompts are needed only at the end."""
    worker_init()
    try:
        os.nice(10)
    except OSError:
        pass


def _worker_state(spec):
    key = json.dumps(spec, sort_keys=True)
    if _WORKER.get("key") != key:
        tokenizer = load_tokenizer(spec["tokenizer"])
        with open(spec["task_words"], encoding="utf-8") as handle:
            words = json.load(handle)
        _WORKER.clear()
        _WORKER.update(
            key=key,
            tokenizer=tokenizer,
            words=words,
            resources={},
            bos=tokenizer.token_to_id(BOS_TOKEN),
            eos=tokenizer.token_to_id(EOS_TOKEN),
        )
    return _WORKER


def _resources(state, spec, which):
    if which not in state["resources"]:
        if which == "train":
            # --train-words all: answers may be any pool word, the held-out ones included (the
            # evaluation draws from all of them; a model never trained to answer a word does not).
            part = "all" if spec.get("train_words") == "all" else "train"
            state["resources"][which] = tasks.Resources(tasks.train_corpus_lines(spec["text_dir"]), state["words"], part)
        else:
            lines = tasks.eval_corpus_lines(spec["text_dir"])
            state["resources"][which] = tasks.Resources(lines, state["words"], "all" if which == "eval" else "heldout")
    return state["resources"][which]


def make_batch(spec, length, batch, seed, mix="all"):
    """`batch` training sequences of exactly `length` tokens: BOS, the sample, EOS, then padding
    (ignored by the loss). kinds: 0 ignore, 1 text, 3 answer form (tasks.py), and
    ANSWER_WORD_BASE + family index for answer words."""
    started = time.perf_counter()
    state = _worker_state(spec)
    res = _resources(state, spec, "train")
    tokenizer = state["tokenizer"]
    probe = [0]  # the most tokens one measure() call saw: far above `length` means a costly fit

    def measure(text):
        tokens = 2 + len(encode(tokenizer, text))
        probe[0] = max(probe[0], tokens)
        return tokens

    rng = tasks.Rng(seed)
    ids = np.full((batch, length), state["eos"], dtype=np.int32)
    kinds = np.zeros((batch, length), dtype=np.int8)
    stats = {"mismatch": 0, "overflow": 0, "families": {}, "sample_seconds_max": 0.0}
    for b in range(batch):
        sample_start = time.perf_counter()
        sample = tasks.training_sample(rng, length, res, measure, mix)
        stats["sample_seconds_max"] = max(stats["sample_seconds_max"], time.perf_counter() - sample_start)
        row, row_kinds = [state["bos"]], [0]
        answer_kind = ANSWER_WORD_BASE + FAMILIES.index(sample.task)
        for text, kind in sample.segments:
            piece = encode(tokenizer, text)
            row += piece
            row_kinds += [answer_kind if kind == tasks.ANSWER_WORD else kind] * len(piece)
        row.append(state["eos"])
        row_kinds.append(tasks.ANSWER_FORM)
        if b == 0 and len(row) != measure(sample.full_text()):
            stats["mismatch"] += 1  # segment-wise tokenization differs from the whole text's
        if len(row) > length:
            stats["overflow"] += 1
            row, row_kinds = row[:length], row_kinds[:length]
        ids[b, : len(row)] = row
        kinds[b, : len(row)] = row_kinds
        stats["families"][sample.task] = stats["families"].get(sample.task, 0) + 1
    # Measured in the worker, so the log can tell slow batches from a slow queue.
    stats.update(seconds=time.perf_counter() - started, probe_tokens_max=probe[0])
    return ids, kinds, stats


def make_eval_sample(spec, task, length, index, part, base_seed):
    state = _worker_state(spec)
    res = _resources(state, spec, "eval" if part == "all" else "eval_heldout")
    tokenizer = state["tokenizer"]

    def measure(text):
        return 1 + len(encode(tokenizer, text))

    sample = tasks.eval_sample(task, length, index, res, measure, base_seed)
    prompt = sample.prompt()
    reference = []
    for text, _ in sample.segments[sample.prompt_segments :]:
        reference += encode(tokenizer, text)
    return {
        "task": task,
        "part": part,
        "length": length,
        "index": index,
        "seed": tasks.sample_seed(base_seed, task, length, index),
        "prompt_ids": [state["bos"]] + encode(tokenizer, prompt),
        "reference_ids": reference,
        "answers": sample.answers,
        "prompt_sha256": hashlib.sha256(prompt.encode("utf-8")).hexdigest(),
    }


class BatchQueue:
    """Batches requested ahead from the worker pool (`depth` in flight), handed out in the order
    they finish. Round 6 took the oldest first: one slow batch then held up training although the
    batches behind it were done. Every batch has its own seed, so the order does not matter."""

    def __init__(self, pool, spec, depth, seed):
        self.pool, self.spec, self.depth, self.seed = pool, spec, depth, seed
        self.in_flight = 0
        self.done = queue.Queue()  # filled by the pool's result thread through the callbacks

    def fill(self, length, batch, mix="all"):
        while self.in_flight < self.depth:
            self.seed += 1
            self.pool.apply_async(make_batch, (self.spec, length, batch, self.seed, mix),
                                  callback=self.done.put, error_callback=lambda error: self.done.put(_Failed(error)))
            self.in_flight += 1

    def get(self, timeout):
        """(ids, kinds, stats, waited): the first finished batch; `waited` is False when one was
        already there. Raises a worker's exception, or queue.Empty after `timeout` seconds."""
        try:
            item, waited = self.done.get_nowait(), False
        except queue.Empty:
            item, waited = self.done.get(timeout=timeout), True
        self.in_flight -= 1
        if isinstance(item, _Failed):
            raise item.error
        ids, kinds, stats = item
        return ids, kinds, stats, waited


class _Failed:
    def __init__(self, error):
        self.error = error


# ----------------------------------------------------------------------------------------------
# Training


def lr_at(schedule, step_in_schedule, fraction):
    warm = min(1.0, (step_in_schedule + 1) / max(1, schedule["warmup_steps"]))
    progress = min(max(fraction, 0.0), 1.0)
    decay = schedule["min_lr_ratio"] + (1 - schedule["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress))
    return schedule["lr"] * warm * decay


def stage_at(stages, fraction):
    for stage in stages:
        if fraction < stage["end"]:
            return stage
    return stages[-1]


def gated_stage(stages, fraction, current, accuracy):
    """The stage to train now. A stage with a gate is kept past its end (by at most
    GATE_MAX_EXTENSION) while `accuracy` (answer accuracy of the last log window in that stage,
    None before the first) is below the gate; leaving late squeezes the later stages into the
    rest of the schedule, in their proportions (their ends are rewritten in `stages`)."""
    stage = stage_at(stages, fraction)
    gate = None if current is None else current.get("gate")
    if stage is current or gate is None or current not in stages:
        return stage
    if fraction < current["end"] + GATE_MAX_EXTENSION and (accuracy is None or accuracy < gate):
        return current
    if fraction > current["end"]:
        index = stages.index(current)
        old_end = current["end"]
        for later in stages[index + 1 : -1]:
            later["end"] = fraction + (later["end"] - old_end) * (1 - fraction) / max(1e-9, 1 - old_end)
        current["end"] = fraction
    return stage_at(stages, fraction)


def make_optimizer(model, schedule, device):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": schedule["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"lr": schedule["lr"], "betas": (0.9, 0.95), "eps": 1e-8}
    if device.startswith("cuda"):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kwargs)


def batch_loss(model, ids, kinds, args, autocast):
    inputs, targets, target_kinds = ids[:, :-1], ids[:, 1:], kinds[:, 1:]
    with autocast():
        logits = model(inputs)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    ce = ce.view(targets.shape)
    lm_mask = ((target_kinds == tasks.CONTEXT) | (target_kinds == tasks.ANSWER_FORM)).float()
    answer_mask = (target_kinds >= ANSWER_WORD_BASE).float()
    lm_loss = (ce * lm_mask).sum() / lm_mask.sum().clamp(min=1)
    answer_loss = (ce * answer_mask).sum() / answer_mask.sum().clamp(min=1)
    loss = args.lm_weight * lm_loss + args.answer_weight * answer_loss
    # Per family, without a device sync: one-hot of the family over answer positions.
    family = (target_kinds - ANSWER_WORD_BASE).clamp(min=0, max=len(FAMILIES) - 1)
    per_family = F.one_hot(family, len(FAMILIES)).float() * answer_mask.unsqueeze(-1)
    hits = (logits.argmax(-1) == targets).float().unsqueeze(-1)
    stats = torch.cat([
        torch.stack([lm_loss.detach(), answer_loss.detach()]),
        (per_family * hits).sum(dim=(0, 1)),  # correct answer words per family
        per_family.sum(dim=(0, 1)),  # answer words per family
    ])
    return loss, stats


def write_bundle(model_dir, out, part_mib):
    """The model folder as an uncompressed tar cut into parts (the GPU machine returns files of at
    most 16 MiB). All parts are written under temporary names first and then renamed together."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(os.listdir(model_dir)):
            tar.add(os.path.join(model_dir, name), arcname="model/" + name)
    data = buffer.getvalue()
    part_bytes = int(part_mib * 1024 * 1024)
    parts = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)]
    names = [os.path.join(out, f"model.tar.{i:02d}") for i in range(len(parts))]
    for name, part in zip(names, parts):
        with open(name + ".tmp", "wb") as handle:
            handle.write(part)
    for name in names:
        os.replace(name + ".tmp", name)
    for stale in sorted(os.listdir(out)):
        if stale.startswith("model.tar.") and os.path.join(out, stale) not in names:
            os.remove(os.path.join(out, stale))
    return len(parts)


def unpack_bundle(folder, destination):
    """Inverse of write_bundle: returns the extracted model folder."""
    parts = sorted(n for n in os.listdir(folder) if n.startswith("model.tar.") and not n.endswith(".tmp"))
    data = b"".join(open(os.path.join(folder, n), "rb").read() for n in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith("model/") or ".." in member.name:
                raise ValueError(f"unexpected entry {member.name!r} in the model bundle")
        try:
            tar.extractall(destination, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extractall(destination)
    return os.path.join(destination, "model")


def save_checkpoint(model, model_dir, out, ids, dtype_name, state, part_mib):
    save_model(model, model_dir, ids["bos"], ids["eos"], dtype_name)
    write_json(os.path.join(out, "train_state.json"), state)
    write_bundle(model_dir, out, part_mib)


def train(model, args, schedule, state, batches, model_dir, out, token_ids, dtype_name, autocast, train_deadline):
    """Runs the schedule from state['schedule_elapsed'] until it ends or the deadline comes."""
    device = args.device
    stages = schedule["stages"]
    optimizer = make_optimizer(model, schedule, device)
    model.train()
    start = time.time()
    elapsed_before = state["schedule_elapsed"]
    # The schedule's length: what is left of it, or what the deadline allows, whichever is less.
    available = max(1.0, train_deadline - start)
    remaining = schedule["seconds"] - elapsed_before
    if remaining > available + 1.0:
        log(f"only {available:.0f} s left for {remaining:.0f} s of schedule: the schedule is compressed")
        schedule["seconds"] = elapsed_before + available
    steps_in_call = 0
    resumed_mid_schedule = state["schedule_step"] > 0
    last_log = last_checkpoint = time.time()
    window = collections.defaultdict(float)
    window_gpu = None
    current_length = None
    current_stage, stage_accuracy, stage_start_step = None, None, 0
    mismatches = 0
    wait_total = 0.0
    summary = {"stages": {}}
    while True:
        now = time.time()
        elapsed = elapsed_before + (now - start)
        fraction = elapsed / schedule["seconds"]
        if fraction >= 1.0 or now >= train_deadline:
            break
        stage = gated_stage(stages, fraction, current_stage, stage_accuracy)
        if stage is not current_stage:
            if current_stage is not None and current_stage.get("gate") is not None:
                log(f"leaving the {current_stage['length']}-token {current_stage.get('mix')} stage at schedule {100 * fraction:.0f}% "
                    f"(answer accuracy {stage_accuracy}, gate {current_stage['gate']})")
            current_stage, stage_accuracy, stage_start_step = stage, None, state["schedule_step"]
        batches.fill(stage["length"], stage["batch"], stage.get("mix", "all"))
        wait_start = time.time()
        ids_np, kinds_np, stats, waited = batches.get(timeout=max(10.0, train_deadline - wait_start))
        waited_seconds = time.time() - wait_start
        window["wait"] += waited_seconds
        window["waits"] += waited
        window["wait_max"] = max(window["wait_max"], waited_seconds)
        window["make_max"] = max(window["make_max"], stats["seconds"])
        window["sample_max"] = max(window["sample_max"], stats["sample_seconds_max"])
        window["probe_max"] = max(window["probe_max"], stats["probe_tokens_max"])
        mismatches += stats["mismatch"]
        wait_total += waited_seconds
        length = ids_np.shape[1]
        # Batches arrive as they finish, so the previous stage's last ones may come a little late.
        if length != current_length and length == stage["length"]:
            log(f"stage: sequences of {length} tokens, batch {ids_np.shape[0]} (schedule {100 * fraction:.0f}%)")
            current_length = length
        ids = torch.from_numpy(ids_np.astype(np.int64)).to(device, non_blocking=True)
        kinds = torch.from_numpy(kinds_np.astype(np.int64)).to(device, non_blocking=True)
        lr = lr_at(schedule, state["schedule_step"], fraction)
        if resumed_mid_schedule:  # fresh optimizer moments: warm up again briefly
            lr *= min(1.0, (steps_in_call + 1) / 50)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, step_stats = batch_loss(model, ids, kinds, args, autocast)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        window_gpu = step_stats if window_gpu is None else window_gpu + step_stats
        window["steps"] += 1
        window["tokens"] += ids_np.size
        state["schedule_step"] += 1
        state["total_steps"] += 1
        state["total_tokens"] += int(ids_np.size)
        steps_in_call += 1
        now = time.time()
        if now - last_log >= args.log_seconds:
            values = window_gpu.tolist()
            lm_sum, answer_sum = values[0], values[1]
            family_correct = values[2 : 2 + len(FAMILIES)]
            family_count = values[2 + len(FAMILIES) :]
            correct_sum, answer_count = sum(family_correct), sum(family_count)
            span = now - last_log
            record = {
                "step": state["total_steps"],
                "length": length,
                "lm_loss": lm_sum / window["steps"],
                "answer_loss": answer_sum / window["steps"],
                "answer_accuracy": correct_sum / max(1.0, answer_count),
                "tokens_per_second": window["tokens"] / span,
                "family_accuracy": {f: (c / n if n else None) for f, c, n in zip(FAMILIES, family_correct, family_count)},
                "data_wait": window["wait"] / span,
                "data_waits": int(window["waits"]),
                "data_wait_max_seconds": window["wait_max"],
                "batch_seconds_max": window["make_max"],
                "sample_seconds_max": window["sample_max"],
                "probe_tokens_max": int(window["probe_max"]),
            }
            by_family = " ".join(f"{short} {c / n:.2f}" for short, c, n in zip(FAMILY_SHORT, family_correct, family_count) if n)
            summary["stages"][str(length)] = record
            # Only windows of this stage's own batches (the queue still held the previous stage's).
            if answer_count >= 50 and state["schedule_step"] - stage_start_step >= window["steps"] + batches.depth:
                stage_accuracy = record["answer_accuracy"]
            log(
                f"step {state['total_steps']:6d} | len {length:5d} x{ids_np.shape[0]:<3d} | lr {lr:.2e} | "
                f"lm {record['lm_loss']:.3f} | ans {record['answer_loss']:.3f} | acc {record['answer_accuracy']:.3f} "
                f"({int(answer_count)}: {by_family}) | {record['tokens_per_second'] / 1e6:.2f}M tok/s | "
                f"data wait {100 * window['wait'] / span:.0f}% ({int(window['waits'])} waits, longest "
                f"{window['wait_max']:.2f} s; batch max {window['make_max']:.2f} s, sample max {window['sample_max']:.3f} s, "
                f"probe max {int(window['probe_max'])} tok) | schedule {100 * fraction:.0f}%"
            )
            window.clear()
            window_gpu = None
            last_log = now
        if now - last_checkpoint >= args.checkpoint_seconds:
            state["schedule_elapsed"] = elapsed_before + (now - start)
            state["total_train_seconds"] = state["train_seconds_before_call"] + (now - start)
            save_checkpoint(model, model_dir, out, token_ids, dtype_name, state, args.bundle_part_mib)
            last_checkpoint = time.time()
            log(f"checkpoint at step {state['total_steps']} ({last_checkpoint - now:.2f} s)")
    end = time.time()
    state["schedule_elapsed"] = elapsed_before + (end - start)
    state["total_train_seconds"] = state["train_seconds_before_call"] + (end - start)
    state["finished"] = state["schedule_elapsed"] >= schedule["seconds"] - 1e-6 or end >= train_deadline
    summary.update(steps_in_call=steps_in_call, seconds_in_call=end - start, tokenization_mismatches=mismatches,
                   data_wait_seconds=wait_total)
    return summary


# ----------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_id, device, autocast):
    cache = Cache(model.cfg["layers"])
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    out = []
    with autocast():
        logits = model(ids, cache=cache, last_only=True)
        for _ in range(max_new_tokens):
            token = int(logits[0, -1].argmax())
            out.append(token)
            if token == eos_id:
                break
            logits = model(torch.tensor([[token]], dtype=torch.long, device=device), cache=cache, last_only=True)
    return out


def evaluate(model, tokenizer, eval_jobs, token_ids, args, autocast, results, results_path, deadline):
    """eval_jobs: list of (label, length, [AsyncResult]). Writes results after every cell."""
    model.eval()
    for label, length, jobs in eval_jobs:
        if time.time() > deadline:
            log(f"eval: skipping {label} at {length} (deadline)")
            continue
        try:
            cell = evaluate_cell(model, tokenizer, jobs, token_ids, args, autocast)
        except Exception:
            cell = {"error": traceback.format_exc(), "score": float("nan"), "samples": 0}
            log(f"eval {label} at {length} failed:\n{cell['error']}")
        results["eval"].setdefault(label, {})[str(length)] = cell
        write_json(results_path, results)
        if "error" not in cell:
            log(f"eval {label:28s} {length:6d}: score {cell['score']:5.1f}  first token "
                f"{cell['first_token_accuracy']:5.1f}  ({cell['samples']} samples, {cell['seconds']:.1f} s)")


def evaluate_cell(model, tokenizer, jobs, token_ids, args, autocast):
    started = time.time()
    scores, first_token, wrong = [], [], []
    for job in jobs:
        sample = job.get(timeout=120)
        budget = tasks.GENERATION_TOKENS[sample["task"]]
        out = generate(model, sample["prompt_ids"], budget, token_ids["eos"], args.device, autocast)
        text = tokenizer.decode([t for t in out if t != token_ids["eos"]])
        value = tasks.score(text, sample["answers"])
        scores.append(value)
        first_token.append(1.0 if out and sample["reference_ids"] and out[0] == sample["reference_ids"][0] else 0.0)
        if value < 1.0 and len(wrong) < 3:
            wrong.append({"index": sample["index"], "expected": sample["answers"], "generated": text})
    return {
        "score": 100.0 * sum(scores) / max(1, len(scores)),
        "first_token_accuracy": 100.0 * sum(first_token) / max(1, len(first_token)),
        "samples": len(scores),
        "prompt_tokens_max": max(len(job.get()["prompt_ids"]) for job in jobs) if jobs else 0,
        "seconds": time.time() - started,
        "wrong_examples": wrong,
    }


@torch.no_grad()
def validation_loss(model, tokenizer, text_dir, device, autocast, windows=8, window_length=4096):
    path = os.path.join(text_dir, "janeausten", tasks.EVAL_NOVEL + ".txt")
    with open(path, encoding="utf-8") as handle:
        ids = encode(tokenizer, handle.read())
    losses = []
    step = max(1, (len(ids) - window_length - 1) // windows)
    for w in range(windows):
        chunk = torch.tensor([ids[w * step : w * step + window_length + 1]], dtype=torch.long, device=device)
        if chunk.shape[1] < 2:
            break
        with autocast():
            logits = model(chunk[:, :-1])
        losses.append(F.cross_entropy(logits.float()[0], chunk[0, 1:]).item())
    return sum(losses) / max(1, len(losses))


def hf_check(model_dir, model, own_tokenizer, sample, device):
    """Load the exported folder with transformers: same logits and same tokenization?"""
    import transformers

    report = {"transformers_version": transformers.__version__}
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).float().to(device).eval()
    report["hf_class"] = type(hf).__name__
    report["hf_rope_theta"] = getattr(hf.config, "rope_theta", None) or str(getattr(hf.config, "rope_parameters", None))
    prompt_ids = sample["prompt_ids"]
    ids = torch.tensor([prompt_ids[:2048]], dtype=torch.long, device=device)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids).logits.float()
        own_logits = model(ids).float()
    report["max_abs_logit_diff_2048"] = (hf_logits - own_logits).abs().max().item()
    report["argmax_agreement_2048"] = (hf_logits.argmax(-1) == own_logits.argmax(-1)).float().mean().item()
    with torch.no_grad():
        full = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        hf_last = hf(input_ids=full).logits[0, -1].float()
        own_last = model(full, last_only=True)[0, -1].float()
    report["prompt_tokens"] = len(prompt_ids)
    report["max_abs_last_logit_diff_full_prompt"] = (hf_last - own_last).abs().max().item()
    report["same_next_token_full_prompt"] = bool(hf_last.argmax().item() == own_last.argmax().item())
    # The transformers tokenizer must give the ids the training used, BOS first.
    text = own_tokenizer.decode(prompt_ids[1:])
    report["tokenizer_same_ids_full_prompt"] = tokenizer(text)["input_ids"] == prompt_ids
    probes = ["The secret of apple is house.", "  12 In the beginning\n\nGod created... 12,345! \u00e9t\u00e9"]
    report["tokenizer_same_ids_probes"] = [
        tokenizer(p)["input_ids"] == [prompt_ids[0]] + encode(own_tokenizer, p) for p in probes
    ]
    del hf
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return report


# ----------------------------------------------------------------------------------------------
# Model card


def write_model_card(path, results, cfg, dtype_name):
    train_info = results["train"]
    lines = [
        "---",
        "license: other",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "---",
        "",
        "# EntropyInfer tiny long-context Llama",
        "",
        "A small Llama-architecture model (GQA, RoPE) trained from scratch in minutes on one GPU by",
        "`training/train.py` of the EntropyInfer repository, as the project's own test model for long-context",
        "inference: it retrieves single-token facts (\"The secret of <key> is <value>.\") from long text.",
        "It is not a general language model.",
        "",
        "## Architecture",
        "",
        f"- LlamaForCausalLM, {results['model']['parameters'] / 1e6:.2f}M parameters, weights in {dtype_name}",
        f"- {cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} query heads and {cfg['kv_heads']} KV heads "
        f"of size {cfg['head_dim']}, SwiGLU MLP {cfg['intermediate']}, RMSNorm eps {cfg['rms_norm_eps']}",
        f"- RoPE theta {cfg['rope_theta']:.0f}, max_position_embeddings {cfg['max_position']}, tied embeddings",
        f"- Byte-level BPE tokenizer (GPT-2 pre-tokenizer regex), {cfg['vocab']} tokens, BOS `{BOS_TOKEN}`, "
        f"EOS `{EOS_TOKEN}`",
        "",
        "## Training",
        "",
        "- Text: five Jane Austen novels and the King James Bible (public domain), bAbI training stories",
        "  (CC BY 3.0, Facebook AI Research); Persuasion is held out as the evaluation haystack.",
        "- Synthetic tasks embedded in the text (training/TASKS.md): needle retrieval (single, multi-key,",
        "  multi-value, multi-query), variable tracking, common and frequent word extraction; keys and",
        "  values come from RULER's wonderwords lists (MIT).",
        f"- {train_info.get('total_steps', 0)} steps, {train_info.get('total_tokens', 0) / 1e6:.0f}M tokens, "
        f"{train_info.get('total_train_seconds', 0):.0f} s on one GPU; curriculum "
        f"{', '.join(str(s['length']) for s in train_info.get('stages', []))} tokens.",
        "",
        "## Evaluation (full attention, greedy, training/TASKS.md scoring)",
        "",
        "| task | length | score | samples |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, cells in results["eval"].items():
        for length, cell in cells.items():
            lines.append(f"| {label} | {length} | {cell['score']:.1f} | {cell['samples']} |")
    if "validation_lm_loss" in results:
        lines += ["", f"Language-model loss on held-out text (Persuasion): {results['validation_lm_loss']:.3f}."]
    lines += [
        "",
        "## Use",
        "",
        "Prompts are BOS followed by text; ask `What is the secret of <key>? It is` and read the next token.",
        "Loads with `transformers` (`AutoModelForCausalLM`, `AutoTokenizer`) and with EntropyInfer.",
        "",
    ]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))


# ----------------------------------------------------------------------------------------------
# Main


def prepare_tokenizer_and_words(args, out_model, text_dir, ruler_dir, resume_model):
    tokenizer_path = os.path.join(out_model, "tokenizer.json")
    words_path = os.path.join(out_model, "task_words.json")
    if resume_model:
        for name in ("tokenizer.json", "tokenizer_config.json", "task_words.json"):
            source = os.path.join(resume_model, name)
            target = os.path.join(out_model, name)
            if not os.path.exists(target) or not os.path.samefile(source, target):
                shutil.copyfile(source, target)
        tokenizer = load_tokenizer(tokenizer_path)
        log(f"tokenizer and word pools taken from {resume_model}")
    else:
        started = time.time()
        lines = tasks.train_corpus_lines(text_dir)
        tokenizer = train_tokenizer(lines, args.vocab_size, tokenizer_path)
        write_tokenizer_config(os.path.join(out_model, "tokenizer_config.json"), args.max_position)

        def single(text):
            return len(encode(tokenizer, text)) == 1

        write_json(words_path, tasks.build_task_words(ruler_dir, single))
        log(f"tokenizer: {tokenizer.get_vocab_size()} tokens trained in {time.time() - started:.1f} s")
    with open(words_path, encoding="utf-8") as handle:
        words = json.load(handle)
    log(f"word pools: {len(words['keys'])} keys, {len(words['values'])} values, {len(words['numbers'])} numbers "
        f"(e.g. {words['keys'][:4]} / {words['values'][:4]})")
    return tokenizer, tokenizer_path, words_path


def main():
    args = parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    work = os.path.abspath(args.work_dir) if args.work_dir else tempfile.mkdtemp(prefix="entropyinfer-train-")
    out_model = os.path.join(work, "model")
    if os.path.isdir(out_model):
        shutil.rmtree(out_model)
    os.makedirs(out_model)
    root = os.path.dirname(HERE)
    text_dir = first_existing(args.text_dir, os.path.join(root, ".cache", "assets-text"),
                              os.path.join(root, "..", "shared", "assets", "text"))
    if text_dir is None or not os.path.isdir(os.path.join(text_dir, "janeausten")):
        sys.exit(f"no training text: give --text-dir (looked at {args.text_dir}, .cache/assets-text, ../shared/assets/text)")
    ruler_dir = first_existing(args.ruler_dir, os.path.join(text_dir, "ruler"), os.path.join(root, "..", "shared", "assets", "ruler"))
    log(f"text {text_dir}, word lists {ruler_dir}, device {args.device}, torch {torch.__version__}, {args.workers} workers")

    # Workers first: forked before CUDA and before the tokenizer trainer's threads exist.
    context = mp.get_context("fork")
    pool = context.Pool(args.workers, initializer=worker_init)
    eval_pool = context.Pool(args.eval_workers, initializer=eval_worker_init)
    try:
        run(args, out, work, out_model, text_dir, ruler_dir, pool, eval_pool)
    finally:
        for p in (pool, eval_pool):
            p.terminate()
            p.join()


def run(args, out, work, out_model, text_dir, ruler_dir, pool, eval_pool):
    resume_model, resume_state = None, None
    if args.resume_from:
        if os.path.exists(os.path.join(args.resume_from, "model.tar.00")):
            resume_model = unpack_bundle(args.resume_from, os.path.join(work, "resume"))
        else:
            config = first_existing(os.path.join(args.resume_from, "model", "config.json"),
                                    os.path.join(args.resume_from, "config.json"))
            if config is None:
                sys.exit(f"--resume-from {args.resume_from}: no model.tar.00, model/config.json or config.json there")
            resume_model = os.path.dirname(os.path.abspath(config))
        state_path = first_existing(os.path.join(args.resume_from, "train_state.json"),
                                    os.path.join(resume_model, "..", "train_state.json"))
        if state_path:
            with open(state_path, encoding="utf-8") as handle:
                resume_state = json.load(handle)
    elif args.eval_only:
        sys.exit("--eval-only needs --resume-from")
    if ruler_dir is None and resume_model is None:
        sys.exit("no RULER word lists: give --ruler-dir")

    tokenizer, tokenizer_path, words_path = prepare_tokenizer_and_words(args, out_model, text_dir, ruler_dir, resume_model)
    token_ids = {"bos": tokenizer.token_to_id(BOS_TOKEN), "eos": tokenizer.token_to_id(EOS_TOKEN)}
    spec = {"tokenizer": tokenizer_path, "task_words": words_path, "text_dir": text_dir, "train_words": args.train_words}

    # Evaluation samples are made by the workers while training runs.
    eval_jobs = []
    single_lengths = [int(x) for x in args.eval_single_lengths.split(",") if x]
    order = [("niah_single", "all", n) for n in sorted(single_lengths, key=lambda n: (n not in (16384, 32768), n))]
    order += [(task, "all", args.eval_other_length) for task in tasks.EVAL_TASKS if task != "niah_single"]
    order += [("niah_single", "heldout", args.eval_other_length)]
    for task, part, length in order:
        jobs = [eval_pool.apply_async(make_eval_sample, (spec, task, length, i, part, args.eval_seed))
                for i in range(args.eval_samples)]
        label = task if part == "all" else task + "_heldout_words"
        eval_jobs.append((label, length, jobs))

    # Model.
    device = args.device
    torch.manual_seed(args.seed)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if resume_model:
        with open(os.path.join(resume_model, "config.json"), encoding="utf-8") as handle:
            cfg = model_config_from_hf(json.load(handle))
    else:
        cfg = model_config_from_args(args, tokenizer.get_vocab_size())
    if cfg["vocab"] != tokenizer.get_vocab_size():
        sys.exit(f"vocabulary mismatch: model {cfg['vocab']}, tokenizer {tokenizer.get_vocab_size()}")
    fresh = FRESH_CURRICULUM if not resume_model else CONTINUATION_CURRICULUM
    stages = parse_curriculum(args.curriculum or fresh)
    table_length = max([cfg["max_position"]] + [s["length"] for s in stages]) + 64
    model = CausalLM(cfg, table_length)
    if resume_model:
        weights = load_safetensors(os.path.join(resume_model, "model.safetensors"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if missing or unexpected:
            sys.exit(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
        log(f"weights loaded from {resume_model}")
    else:
        model.init_weights()
    model.to(device)
    dtype_name = args.export_dtype
    log(f"model: {parameter_count(model) / 1e6:.2f}M parameters {cfg}; export as {dtype_name}")

    if device.startswith("cuda"):
        def autocast():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        import contextlib

        def autocast():
            return contextlib.nullcontext()

    # Schedule and state.
    state = {
        "total_steps": 0,
        "total_tokens": 0,
        "total_train_seconds": 0.0,
        "calls": [],
    }
    if resume_state:
        for key in ("total_steps", "total_tokens", "total_train_seconds", "calls"):
            state[key] = resume_state.get(key, state[key])
    if resume_state and not resume_state.get("finished", True) and not args.curriculum:
        schedule = resume_state["schedule"]
        state["schedule_step"] = resume_state.get("schedule_step", 0)
        state["schedule_elapsed"] = resume_state.get("schedule_elapsed", 0.0)
        log(f"continuing the unfinished schedule at {state['schedule_elapsed']:.0f} of {schedule['seconds']:.0f} s")
    else:
        schedule = {
            "stages": stages,
            "seconds": args.train_seconds,
            "lr": args.lr if args.lr is not None else (2e-3 if not resume_model else 1e-3),
            "min_lr_ratio": args.min_lr_ratio,
            "warmup_steps": args.warmup_steps if not resume_model else min(args.warmup_steps, 100),
            "weight_decay": args.weight_decay,
        }
        state["schedule_step"] = 0
        state["schedule_elapsed"] = 0.0
    state["schedule"] = schedule
    state["finished"] = False
    state["train_seconds_before_call"] = state["total_train_seconds"]
    log("curriculum: " + ", ".join(f"{s['length']} x{s['batch']} {s.get('mix', 'all')}"
                                   + (f" (gate {s['gate']})" if s.get("gate") is not None else "")
                                   + f" until {100 * s['end']:.0f}%" for s in schedule["stages"])
        + f"; lr {schedule['lr']:.1e}, {schedule['seconds']:.0f} s")

    results_path = os.path.join(out, "eval.json")
    results = {
        "model": {"config": cfg, "parameters": parameter_count(model), "export_dtype": dtype_name},
        "args": vars(args),
        "eval": {},
    }
    train_summary = {}
    if not args.eval_only:
        train_start = time.time()
        train_deadline = min(train_start + args.train_seconds,
                             SCRIPT_START + args.deadline_seconds - args.eval_reserve_seconds)
        batches = BatchQueue(pool, spec, depth=2 * args.workers, seed=args.seed * 1_000_003 + state["total_steps"])
        try:
            train_summary = train(model, args, schedule, state, batches, out_model, out, token_ids, dtype_name, autocast,
                                  train_deadline)
        except Exception:
            log("training stopped by an error; exporting and evaluating what there is:\n" + traceback.format_exc())
            train_summary = {"error": traceback.format_exc()}
            state["finished"] = False
        state["calls"].append({"steps": train_summary.get("steps_in_call"), "seconds": train_summary.get("seconds_in_call"),
                               "stages": [s["length"] for s in schedule["stages"]], "lr": schedule["lr"],
                               "train_words": args.train_words})
    state.pop("train_seconds_before_call", None)
    if dtype_name == "bfloat16":
        with torch.no_grad():  # evaluate exactly what is exported
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
    save_checkpoint(model, out_model, out, token_ids, dtype_name, state, args.bundle_part_mib)
    model_mb = os.path.getsize(os.path.join(out_model, "model.safetensors")) / 1e6
    log(f"exported {out_model} ({model_mb:.1f} MB of weights) after {state['total_steps']} steps, "
        f"{state['total_tokens'] / 1e6:.0f}M tokens")
    if model_mb > MAX_MODEL_MB:
        log(f"WARNING: model.safetensors is over {MAX_MODEL_MB:.0f} MB")

    results["train"] = {
        "total_steps": state["total_steps"],
        "total_tokens": state["total_tokens"],
        "total_train_seconds": state["total_train_seconds"],
        "finished_schedule": state["finished"],
        "stages": schedule["stages"],
        "lr": schedule["lr"],
        "train_words": args.train_words,
        "this_call": train_summary,
    }
    write_json(results_path, results)

    # Evaluation, most important first; the manifest lets another implementation check its prompts.
    eval_deadline = SCRIPT_START + args.deadline_seconds + 30
    try:
        evaluate(model, tokenizer, eval_jobs, token_ids, args, autocast, results, results_path, eval_deadline)
        with open(os.path.join(out, "eval_manifest.jsonl"), "w", encoding="utf-8") as handle:
            for label, length, jobs in eval_jobs:
                for job in jobs:
                    if job.ready():
                        s = job.get()
                        handle.write(json.dumps({
                            "task": s["task"], "words": s["part"], "length": s["length"], "index": s["index"],
                            "seed": s["seed"], "prompt_tokens": len(s["prompt_ids"]), "answers": s["answers"],
                            "prompt_sha256": s["prompt_sha256"],
                        }) + "\n")
    except Exception:
        log("evaluation error:\n" + traceback.format_exc())
        results["eval_error"] = traceback.format_exc()
    try:
        results["validation_lm_loss"] = validation_loss(model, tokenizer, text_dir, device, autocast)
        log(f"held-out LM loss (Persuasion, 8 x 4096 tokens): {results['validation_lm_loss']:.3f}")
    except Exception:
        results["validation_error"] = traceback.format_exc()
    write_json(results_path, results)

    if not args.no_hf_check and time.time() < SCRIPT_START + args.deadline_seconds + 20:
        try:
            sample = eval_jobs[0][2][0].get(timeout=60)
            results["hf_check"] = hf_check(out_model, model, tokenizer, sample, device)
            log(f"transformers check: {results['hf_check']}")
        except Exception:
            results["hf_check"] = {"error": traceback.format_exc()}
            log("transformers check failed:\n" + results["hf_check"]["error"])
        write_json(results_path, results)

    write_model_card(os.path.join(out_model, "README.md"), results, cfg, dtype_name)
    parts = write_bundle(out_model, out, args.bundle_part_mib)
    if args.export_folder:
        if os.path.isdir(args.export_folder):
            shutil.rmtree(args.export_folder)
        shutil.copytree(out_model, args.export_folder)
    log(f"model folder {out_model}, bundled into {parts} part(s) in {out}"
        + (f", copied to {args.export_folder}" if args.export_folder else ""))
    print_summary(results)


def print_summary(results):
    print("\n=== summary ===")
    t = results["train"]
    print(f"steps {t['total_steps']}, tokens {t['total_tokens'] / 1e6:.0f}M, training {t['total_train_seconds']:.0f} s, "
          f"schedule finished: {t['finished_schedule']}")
    for label, cells in results["eval"].items():
        row = "  ".join(f"{length}: {cell['score']:5.1f}" for length, cell in cells.items())
        print(f"{label:28s} {row}")
    if "validation_lm_loss" in results:
        print(f"held-out LM loss {results['validation_lm_loss']:.3f}")
    print(f"total wall time {time.time() - SCRIPT_START:.0f} s")


if __name__ == "__main__":
    main()
