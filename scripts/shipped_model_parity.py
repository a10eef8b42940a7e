#!/usr/bin/env python3
"""Reference numbers for the shipped model, computed by Hugging Face transformers (run on the GPU machine).

For a few evaluation prompts of training/TASKS.md (niah_single, sample 0, at the given lengths) it
writes the prompt ids, transformers' logits at the last prompt position (float32 model, SDPA) and its
greedy continuation. tests/test_shipped_model.cpp (CPU engine) and
tests/gpu/test_cuda_shipped_model.cpp (CUDA engine) compare the engine with these numbers.

    python3 scripts/shipped_model_parity.py --model models/needle-llama-11m \
        --text-dir .cache/assets-text --out tests/fixtures/shipped_model/expected.json
"""

import argparse
import json
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "training"))
import tasks  # noqa: E402

GREEDY_STEPS = 4


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--text-dir", required=True, help="folder with janeausten/persuasion.txt")
    parser.add_argument("--out", required=True)
    parser.add_argument("--lengths", default="1024,32768")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    with open(os.path.join(args.model, "task_words.json"), encoding="utf-8") as handle:
        words = json.load(handle)
    resources = tasks.Resources(tasks.eval_corpus_lines(args.text_dir), words, "all")
    bos = tokenizer.token_to_id("<|begin_of_text|>")

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(args.device).eval()

    cases = []
    for length in (int(x) for x in args.lengths.split(",")):
        sample = tasks.eval_sample("niah_single", length, 0, resources, lambda text: 1 + len(encode(text)))
        ids = [bos] + encode(sample.prompt())
        with torch.no_grad():
            prompt = torch.tensor([ids], device=args.device)
            logits = model(prompt).logits[0, -1].float().cpu()
            generated = model.generate(prompt, max_new_tokens=GREEDY_STEPS, do_sample=False,
                                       eos_token_id=None, pad_token_id=tokenizer.token_to_id("<|end_of_text|>"))
        continuation = generated[0, len(ids):].tolist()
        top2 = torch.topk(logits, 2).values
        answer_ids = encode(" " + sample.answers[0])
        cases.append({
            "name": f"niah_single_{length}_0",
            "task": "niah_single",
            "length": length,
            "index": 0,
            "answers": sample.answers,
            "prompt_ids": ids,
            "last_logits": [round(float(x), 6) for x in logits],
            "greedy_continuation": continuation,
            "top2_margin": float(top2[0] - top2[1]),
            "transformers_answer_correct": continuation[: len(answer_ids)] == answer_ids,
        })
        print(f"{cases[-1]['name']}: {len(ids)} prompt tokens, continuation {continuation} "
              f"({tokenizer.decode(continuation)!r}), answer {sample.answers}, margin {cases[-1]['top2_margin']:.3f}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({
            "model": os.path.basename(os.path.normpath(args.model)),
            "reference": "transformers AutoModelForCausalLM, float32, sdpa",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "cases": cases,
        }, handle)
        handle.write("\n")


if __name__ == "__main__":
    main()
