#!/usr/bin/env python3
"""Writes the Hugging Face parity fixtures under tests/fixtures/parity/.

Each fixture is a tiny random-weight checkpoint saved by transformers (config.json + safetensors) together
with the logits transformers computes for a few fixed prompts and a 32-token greedy continuation of each.
tests/test_hf_parity.cpp loads the same folders with the engine and checks it against these numbers.

Needs python3 with torch, transformers (5.x), tokenizers, safetensors and numpy; no network. Usage:

    python3 scripts/make_parity_fixtures.py --out OUT_DIR [--text FILE] [--cases a,b,...]

--text is a plain-text file (a few hundred KB) from which the tiny_chat_llama tokenizer is trained.

expected.json of each fixture (see tests/fixtures/parity/README.md):
  case, architecture, dtype, prompts, logits_file, logits_shape, greedy_continuations,
  transformers_version, torch_version, notes, plus per-case extras documented in the README.
"""

import argparse
import copy
import inspect
import json
import math
import os
import shutil
import sys
import traceback

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

GREEDY_STEPS = 32
# A greedy step whose top-two logits are closer than this (in absolute logit units) could flip under
# the engine's different summation order; seeds are retried until every step clears it.
MIN_GREEDY_MARGIN = 2e-3
MAX_SEED_TRIES = 12

# Llama 3's pre-tokenizer split pattern.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3 Instruct's chat template, written out for this fixture.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

CHAT_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

TOKENIZER_TEST_STRINGS = [
    "Hello world",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "  leading spaces and   multiple   gaps\n\nnew paragraph\r\nend",
    "Numbers: 1234567 and 3.14159, year 1813, 0042.",
    "Contractions: I'm, you're, she'll, they'd, it's, WE'VE, DON'T",
    "Unicode: caf\u00e9, na\u00efve, Z\u00fcrich, \u65e5\u672c\u8a9e, emoji \U0001f642, \u2211x\u00b2",
    "tabs\tand\ttrailing space ",
    "Mr. Darcy's    estate!!! ...? (yes)",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
    "",
]

CHAT_TEST_CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [
        {"role": "user", "content": "Tell me about Anne Elliot."},
        {"role": "assistant", "content": "She is the heroine of Persuasion."},
        {"role": "user", "content": "  And Captain Wentworth?  "},
    ],
]


def log(message):
    print(message, flush=True)


def transformers_major():
    return int(transformers.__version__.split(".")[0])


# ----------------------------------------------------------------------------------------------------
# Case definitions


def base_llama_like(vocab=320, layers=2, intermediate=128, max_pos=256):
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
    )


def case_table():
    """name -> spec. spec keys: family, config (kwargs), rope (dict with rope_theta and optional
    scaling keys), tied, dtype, seed, prompt_lengths, extras."""
    cases = {}
    cases["llama"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=3, intermediate=144),
        rope={"rope_type": "default", "rope_theta": 10000.0},
        tied=False,
        dtype="float32",
        seed=101,
        prompt_lengths=[5, 17, 40],
    )
    cases["llama3_scaling"] = dict(
        family="llama",
        config=base_llama_like(vocab=384, layers=2, intermediate=160, max_pos=512),
        rope={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tied=True,
        dtype="float32",
        seed=202,
        prompt_lengths=[6, 40],
    )
    cases["llama_linear"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=2, intermediate=128),
        rope={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        tied=False,
        dtype="float32",
        seed=303,
        prompt_lengths=[9, 40],
    )
    # transformers' dynamic NTK grows past max_position_embeddings; original_max_position_embeddings
    # is set to the same value so that either reading of the threshold gives the same function.
    cases["llama_dynamic"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=2, intermediate=128, max_pos=32),
        rope={
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 32,
        },
        tied=False,
        dtype="float32",
        seed=404,
        prompt_lengths=[7, 20, 40],
    )
    # max_position_embeddings = factor * original so that no transformers version re-derives a
    # different factor from the ratio.
    cases["llama_yarn"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=2, intermediate=128, max_pos=256),
        rope={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tied=False,
        dtype="float32",
        seed=505,
        prompt_lengths=[8, 40],
    )
    cases["qwen2"] = dict(
        family="qwen2",
        config=base_llama_like(vocab=352, layers=2, intermediate=176),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        tied=True,
        dtype="float32",
        seed=606,
        prompt_lengths=[5, 23, 38],
    )
    cases["qwen3"] = dict(
        family="qwen3",
        config=dict(base_llama_like(vocab=320, layers=3, intermediate=128), head_dim=32, rms_norm_eps=1e-6),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        tied=False,
        dtype="float32",
        seed=707,
        prompt_lengths=[5, 17, 40],
    )
    cases["mistral"] = dict(
        family="mistral",
        config=dict(base_llama_like(vocab=320, layers=2, intermediate=160), head_dim=16, sliding_window=4096),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        tied=False,
        dtype="float32",
        seed=808,
        prompt_lengths=[11, 36],
    )
    cases["pangu"] = dict(
        family="pangu",
        config=base_llama_like(vocab=336, layers=2, intermediate=160),
        rope={"rope_type": "default", "rope_theta": 16000000.0},
        tied=False,
        dtype="float32",
        seed=909,
        prompt_lengths=[5, 19, 40],
    )
    cases["llama_bf16"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=2, intermediate=144),
        rope={"rope_type": "default", "rope_theta": 500000.0},
        tied=False,
        dtype="bfloat16",
        seed=1111,
        prompt_lengths=[6, 30],
    )
    cases["qwen2_bf16"] = dict(
        family="qwen2",
        config=base_llama_like(vocab=320, layers=2, intermediate=176),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        tied=True,
        dtype="bfloat16",
        seed=1212,
        prompt_lengths=[7, 33],
    )
    cases["sharded"] = dict(
        family="llama",
        config=base_llama_like(vocab=320, layers=3, intermediate=128),
        rope={"rope_type": "default", "rope_theta": 10000.0},
        tied=False,
        dtype="float32",
        seed=1313,
        prompt_lengths=[5, 24],
        max_shard_size="120KB",
    )
    cases["tiny_chat_llama"] = dict(
        family="llama",
        config=base_llama_like(vocab=1024, layers=2, intermediate=128, max_pos=2048),
        rope={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        tied=True,
        dtype="float32",
        seed=1414,
        prompt_lengths=None,  # from the tokenizer
        chat=True,
    )
    return cases


# ----------------------------------------------------------------------------------------------------
# Building, randomising, saving


def config_class(family):
    if family in ("llama", "pangu"):
        return transformers.LlamaConfig
    if family == "qwen2":
        return transformers.Qwen2Config
    if family == "qwen3":
        return transformers.Qwen3Config
    if family == "mistral":
        return transformers.MistralConfig
    raise ValueError(family)


def make_config(spec):
    kwargs = dict(spec["config"])
    kwargs["tie_word_embeddings"] = spec["tied"]
    if spec["family"] == "pangu":
        kwargs["attention_bias"] = True
        kwargs["mlp_bias"] = False
    rope = dict(spec["rope"])
    cls = config_class(spec["family"])
    if transformers_major() >= 5:
        config = cls(rope_parameters=rope, **kwargs)
    else:
        theta = rope.pop("rope_theta")
        rope_type = rope.pop("rope_type")
        scaling = None if rope_type == "default" else dict(rope, rope_type=rope_type)
        config = cls(rope_theta=theta, rope_scaling=scaling, **kwargs)
    return config


def build_model(config):
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    except TypeError:
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config)
    return model.float().eval()


def randomise(model, seed):
    """Weights with a scale that makes logits non-trivial; norms and biases random too, so that a
    missing bias or a norm weight read from the wrong tensor shows up."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                values = torch.rand(param.shape, generator=generator) * 0.8 + 0.6
            elif name.endswith(".bias"):
                values = torch.randn(param.shape, generator=generator) * 0.2
            elif "embed_tokens" in name:
                values = torch.randn(param.shape, generator=generator) * 0.4
            else:
                values = torch.randn(param.shape, generator=generator) * 0.15
            param.copy_(values.to(param.dtype))


def save_model(model, folder, max_shard_size=None):
    kwargs = {}
    parameters = inspect.signature(model.save_pretrained).parameters
    if "safe_serialization" in parameters:
        kwargs["safe_serialization"] = True
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **kwargs)


def load_model(folder, dtype):
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(
            folder, torch_dtype=torch_dtype, attn_implementation="eager")
    return model.eval()


# ----------------------------------------------------------------------------------------------------
# Running


@torch.no_grad()
def prompt_logits(model, prompt):
    ids = torch.tensor([prompt], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0].float().numpy()


def top_two_margin(row):
    order = np.argsort(-row, kind="stable")
    return float(row[order[0]] - row[order[1]])


def first_argmax(row):
    return int(np.argmax(row))  # numpy returns the first maximum, as the engine's test does


@torch.no_grad()
def greedy_cached(model, prompt, steps=GREEDY_STEPS):
    """Prefill then one token at a time through the KV cache: the same schedule as the engine's
    Transformer::forward loop (this matters for dynamic NTK, whose frequencies depend on the length
    when a key enters the cache)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    row = out.logits[0, -1].float().numpy()
    tokens, margins = [], []
    for _ in range(steps):
        token = first_argmax(row)
        tokens.append(token)
        margins.append(top_two_margin(row))
        out = model(input_ids=torch.tensor([[token]], dtype=torch.long), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        row = out.logits[0, -1].float().numpy()
    return tokens, margins


@torch.no_grad()
def greedy_full(model, prompt, steps=GREEDY_STEPS):
    """Argmax loop over full forward passes without a cache."""
    sequence = list(prompt)
    tokens = []
    for _ in range(steps):
        row = model(input_ids=torch.tensor([sequence], dtype=torch.long), use_cache=False).logits[0, -1]
        token = first_argmax(row.float().numpy())
        tokens.append(token)
        sequence.append(token)
    return tokens


def random_prompts(vocab, lengths, seed):
    rng = np.random.default_rng(seed)
    # Avoid ids 0-2 (pad/bos/eos by convention) so that prompts are ordinary text tokens.
    return [[int(x) for x in rng.integers(3, vocab, size=length)] for length in lengths]


def relative_max_diff(a, b):
    scale = float(np.max(np.abs(b)))
    return float(np.max(np.abs(a - b))) / max(scale, 1e-30)


def write_logits(path, rows):
    stacked = np.concatenate(rows, axis=0).astype("<f4")
    stacked.tofile(path)
    return list(stacked.shape)


def stored_dtypes(folder):
    """The dtypes named in the safetensors headers of a saved checkpoint."""
    dtypes = set()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as stream:
            header_length = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(header_length))
        dtypes.update(entry["dtype"] for key, entry in header.items() if key != "__metadata__")
    return dtypes


def folder_bytes(folder):
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


# ----------------------------------------------------------------------------------------------------
# The tokenizer of tiny_chat_llama


def train_chat_tokenizer(text_path, folder, trained_vocab=1000):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    with open(text_path, "r", encoding="utf-8", errors="replace") as stream:
        text = stream.read()
    paragraphs = [p for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=trained_vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(paragraphs, trainer=trainer)

    # Llama 3 looks whole pre-tokenized words up in the vocabulary before applying merges.
    as_json = json.loads(tokenizer.to_str())
    as_json["model"]["ignore_merges"] = True
    tokenizer = Tokenizer.from_str(json.dumps(as_json))

    tokenizer.add_special_tokens(CHAT_SPECIAL_TOKENS)
    bos_id = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos_id)],
        ),
    ])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))

    added = {}
    for token in CHAT_SPECIAL_TOKENS:
        added[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    tokenizer_config = {
        "added_tokens_decoder": added,
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as stream:
        json.dump(tokenizer_config, stream, indent=2, ensure_ascii=False)
        stream.write("\n")
    with open(os.path.join(folder, "special_tokens_map.json"), "w", encoding="utf-8") as stream:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, stream, indent=2)
        stream.write("\n")
    return tokenizer


def load_reference_tokenizer(folder, notes):
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # noqa: BLE001 - fall back to the generic fast tokenizer class
        from transformers import PreTrainedTokenizerFast

        notes.append(f"AutoTokenizer failed ({error!r}); used PreTrainedTokenizerFast(tokenizer_file=...)")
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(folder, "tokenizer.json"),
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
        )
        tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    notes.append(f"reference tokenizer: transformers {type(tokenizer).__name__}")
    return tokenizer


def render_chat(tokenizer, messages, notes):
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # noqa: BLE001 - render the same template with jinja2 directly
        import jinja2

        notes.append(f"apply_chat_template failed ({error!r}); rendered with jinja2")
        environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return environment.from_string(LLAMA3_CHAT_TEMPLATE).render(
            messages=messages, add_generation_prompt=True, bos_token="<|begin_of_text|>")


def reference_tokenizer_cases(folder, raw_tokenizer, notes):
    """Ids as transformers' tokenizer gives them, checked against the tokenizers library directly."""
    hf_tokenizer = load_reference_tokenizer(folder, notes)
    cases = []
    for text in TOKENIZER_TEST_STRINGS:
        ids = [int(x) for x in hf_tokenizer(text, add_special_tokens=False)["input_ids"]]
        ids_with_bos = [int(x) for x in hf_tokenizer(text, add_special_tokens=True)["input_ids"]]
        raw_ids = list(raw_tokenizer.encode(text, add_special_tokens=False).ids)
        if raw_ids != ids:
            notes.append(f"tokenizers and transformers disagree on {text!r}: {raw_ids} vs {ids}")
        raw_with_bos = list(raw_tokenizer.encode(text, add_special_tokens=True).ids)
        if raw_with_bos != ids_with_bos:
            notes.append(f"with special tokens, tokenizers and transformers disagree on {text!r}: "
                         f"{raw_with_bos} vs {ids_with_bos}")
        decoded = hf_tokenizer.decode(ids)
        cases.append({"text": text, "ids": ids, "ids_with_bos": ids_with_bos, "decoded": decoded})
    chat_cases = []
    for messages in CHAT_TEST_CONVERSATIONS:
        rendered = render_chat(hf_tokenizer, messages, notes)
        ids = [int(x) for x in hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]]
        chat_cases.append({
            "messages": messages,
            "add_generation_prompt": True,
            "text": rendered,
            "ids": ids,
        })
    return cases, chat_cases


# ----------------------------------------------------------------------------------------------------
# One case


def rewrite_as_pangu(folder, spec):
    """transformers has no openPangu class; LlamaForCausalLM(attention_bias=True) computes the same
    function. The config is rewritten into the shape of openPangu-Embedded's own config.json."""
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as stream:
        original = json.load(stream)
    cfg = spec["config"]
    pangu = {
        "architectures": ["PanguEmbeddedForCausalLM"],
        "model_type": "PanguEmbedded",
        "auto_map": {
            "AutoConfig": "configuration_openpangu_dense.PanguEmbeddedConfig",
            "AutoModel": "modeling_openpangu_dense.PanguEmbeddedModel",
            "AutoModelForCausalLM": "modeling_openpangu_dense.PanguEmbeddedForCausalLM",
        },
        "attention_dropout": 0.0,
        "bias": True,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": spec["rope"]["rope_theta"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": original.get("transformers_version", transformers.__version__),
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(pangu, stream, indent=2)
        stream.write("\n")
    return original


def generate_case(name, spec, out_root, text_path):
    folder = os.path.join(out_root, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    notes = []
    dtype = spec["dtype"]
    extras = {}

    raw_tokenizer = None
    if spec.get("chat"):
        if not text_path or not os.path.exists(text_path):
            raise RuntimeError(f"tiny_chat_llama needs --text (got {text_path!r})")
        raw_tokenizer = train_chat_tokenizer(text_path, folder)
        spec = copy.deepcopy(spec)
        spec["config"]["bos_token_id"] = raw_tokenizer.token_to_id("<|begin_of_text|>")
        spec["config"]["eos_token_id"] = [
            raw_tokenizer.token_to_id("<|end_of_text|>"),
            raw_tokenizer.token_to_id("<|eot_id|>"),
        ]
        tokenizer_vocab = raw_tokenizer.get_vocab_size(with_added_tokens=True)
        if tokenizer_vocab > spec["config"]["vocab_size"]:
            raise RuntimeError(f"tokenizer has {tokenizer_vocab} tokens, more than the model's vocabulary")
        extras["tokenizer_vocab_size"] = tokenizer_vocab
        cases, chat_cases = reference_tokenizer_cases(folder, raw_tokenizer, notes)
        extras["tokenizer_cases"] = cases
        extras["chat_cases"] = chat_cases
        # A rendered chat prompt and a short plain text with the beginning-of-text token.
        chat_prompts = [chat_cases[0]["ids"], cases[0]["ids_with_bos"]]

    chosen = None
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt * 7919
        torch.manual_seed(seed)
        config = make_config(spec)
        model = build_model(config)
        randomise(model, seed)
        if dtype == "bfloat16":
            # Round the weights to bf16 values but keep the module in fp32: this is the function the
            # engine computes (fp32 arithmetic on bf16 weights). Casting the module itself would also
            # cast the RoPE inverse-frequency buffer, which transformers keeps in fp32 when it loads.
            with torch.no_grad():
                for param in model.parameters():
                    param.copy_(param.to(torch.bfloat16).float())
        # Prompts: random ids, or for the chat model what the tokenizer gives for real text.
        if spec.get("chat"):
            prompts = chat_prompts
        else:
            prompts = random_prompts(spec["config"]["vocab_size"], spec["prompt_lengths"], seed)
        chosen = (seed, config, model, prompts)
        # Margin check in fp32 compute, on a fresh copy per prompt (dynamic NTK keeps state).
        margins = []
        for prompt in prompts:
            _, prompt_margins = greedy_cached(copy.deepcopy(model).float(), prompt)
            margins.extend(prompt_margins)
        if min(margins) >= MIN_GREEDY_MARGIN:
            break
        log(f"  {name}: seed {seed} has a greedy margin of {min(margins):.2e}; trying another")
    seed, config, model, prompts = chosen

    to_save = copy.deepcopy(model).to(torch.bfloat16) if dtype == "bfloat16" else model
    save_model(to_save, folder, spec.get("max_shard_size"))
    del to_save
    stored = stored_dtypes(folder)
    wanted = "BF16" if dtype == "bfloat16" else "F32"
    if stored != {wanted}:
        raise RuntimeError(f"checkpoint holds tensors of {sorted(stored)}, expected only {wanted}")

    # Reload and compare with the in-memory model: what is on disk must be the same function (for bf16,
    # the reloaded weights widened to fp32 against the in-memory fp32 model holding bf16 values).
    reloaded = load_model(folder, dtype).float()
    reload_diffs = []
    for prompt in prompts:
        a = prompt_logits(model, prompt)
        b = prompt_logits(reloaded, prompt)
        reload_diffs.append(relative_max_diff(b, a))
    reload_diff = max(reload_diffs)
    if reload_diff > 1e-6:
        raise RuntimeError(f"reloaded checkpoint differs from the in-memory model by {reload_diff} (relative)")
    extras["reload_max_relative_diff"] = reload_diff
    saved_config = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    rope_written = {k: saved_config[k] for k in ("rope_parameters", "rope_scaling", "rope_theta") if k in saved_config}
    notes.append("config.json RoPE fields as transformers wrote them: " + json.dumps(rope_written, sort_keys=True))
    del reloaded

    # Reference numbers, each from a freshly loaded model: transformers' dynamic NTK keeps state across
    # calls (its cached length), so a fresh model per prompt makes every prompt independent.
    logits_rows, greedy, greedy_margins, full_agree = [], [], [], []
    for prompt in prompts:
        logits_rows.append(prompt_logits(load_model(folder, dtype), prompt))
        tokens, margins = greedy_cached(load_model(folder, dtype), prompt)
        greedy.append(tokens)
        greedy_margins.append(min(margins))
        full_agree.append(greedy_full(load_model(folder, dtype), prompt) == tokens)
    shape = write_logits(os.path.join(folder, "logits.f32"), logits_rows)

    if dtype == "bfloat16":
        # transformers computing in bf16 is the primary reference; the engine computes in fp32 from the
        # same bf16 weights, so the fp32 computation of those weights is recorded too, and the spread
        # between the two sets the bound the engine is held to against the bf16 logits.
        fp32_rows, fp32_greedy, fp32_margins = [], [], []
        for prompt in prompts:
            fp32_rows.append(prompt_logits(load_model(folder, dtype).float(), prompt))
            tokens, margins = greedy_cached(load_model(folder, dtype).float(), prompt)
            fp32_greedy.append(tokens)
            fp32_margins.append(min(margins))
        write_logits(os.path.join(folder, "logits_fp32.f32"), fp32_rows)
        spread = max(relative_max_diff(b, f) for b, f in zip(logits_rows, fp32_rows))
        extras["fp32_logits_file"] = "logits_fp32.f32"
        extras["greedy_continuations_fp32"] = fp32_greedy
        extras["greedy_min_margin_fp32"] = min(fp32_margins)
        extras["bf16_vs_fp32_relative_spread"] = spread
        extras["bf16_engine_relative_bound"] = 2.0 * spread + 1e-3
        notes.append(
            "logits.f32 is transformers computing in bfloat16 on CPU; logits_fp32.f32 is the same bf16 "
            "weights computed in float32. max|bf16 - fp32| / max|fp32| = %.3e; an fp32 engine is held to "
            "2x that plus 1e-3 against logits.f32 and to 1e-4 against logits_fp32.f32, and its greedy "
            "continuation must equal greedy_continuations_fp32." % spread)

    if spec.get("max_shard_size"):
        index_path = os.path.join(folder, "model.safetensors.index.json")
        if not os.path.exists(index_path):
            raise RuntimeError("sharded case wrote no model.safetensors.index.json")
        shards = sorted(set(json.load(open(index_path, encoding="utf-8"))["weight_map"].values()))
        if len(shards) < 2:
            raise RuntimeError(f"sharded case wrote only {shards}")
        extras["shards"] = shards

    architecture = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))["architectures"][0]
    if spec["family"] == "pangu":
        rewrite_as_pangu(folder, spec)
        architecture = "PanguEmbeddedForCausalLM"
        notes.append("computed by LlamaForCausalLM(attention_bias=True, mlp_bias=False); config.json rewritten "
                     "to openPangu-Embedded's own shape (architectures, model_type, \"bias\": true, rope_theta)")

    if dtype == "float32":
        notes.append("float32 weights, logits by transformers in float32 (eager attention, CPU)")
    if not all(full_agree):
        notes.append("greedy over full forward passes (no cache) differs from the cached one for prompts %s; "
                     "greedy_continuations follow the cached schedule, as the engine decodes"
                     % [i for i, ok in enumerate(full_agree) if not ok])
    if spec["rope"]["rope_type"] == "dynamic":
        notes.append("dynamic NTK: frequencies follow the sequence length when each key enters the cache "
                     "(prefill at the prompt length, then one token at a time)")

    expected = {
        "case": name,
        "architecture": architecture,
        "dtype": dtype,
        "prompts": prompts,
        "logits_file": "logits.f32",
        "logits_shape": shape,
        "greedy_continuations": greedy,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "notes": notes,
        "seed": seed,
        "compute_device": "cpu",
        "greedy_min_margin": min(greedy_margins),
        "greedy_full_forward_agrees": full_agree,
        "rope": spec["rope"],
        "tied_embeddings": spec["tied"],
    }
    expected.update(extras)
    with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as stream:
        json.dump(expected, stream, indent=1, ensure_ascii=False)
        stream.write("\n")
    size = folder_bytes(folder)
    log(f"  {name}: {architecture} {dtype} prompts {[len(p) for p in prompts]} seed {seed} "
        f"margin {min(greedy_margins):.3e} reload diff {reload_diff:.1e} size {size} bytes")
    if size > 1024 * 1024:
        log(f"  WARNING: fixture {name} is {size} bytes, over 1 MB")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder to write one sub-folder per case into")
    parser.add_argument("--text", default=None, help="text file to train the tiny_chat_llama tokenizer on")
    parser.add_argument("--cases", default=None, help="comma-separated subset of cases")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}")

    cases = case_table()
    selected = list(cases) if not args.cases else args.cases.split(",")
    os.makedirs(args.out, exist_ok=True)
    failures = []
    for name in selected:
        log(f"case {name}")
        try:
            generate_case(name, cases[name], args.out, args.text)
        except Exception:  # noqa: BLE001 - one case failing must not stop the others
            failures.append(name)
            log(traceback.format_exc())
            shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
    with open(os.path.join(args.out, "GENERATION.txt"), "w", encoding="utf-8") as stream:
        stream.write(f"transformers {transformers.__version__}, torch {torch.__version__}\n")
        stream.write(f"generated: {[n for n in selected if n not in failures]}\n")
        stream.write(f"failed: {failures}\n")
    log(f"done; failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
