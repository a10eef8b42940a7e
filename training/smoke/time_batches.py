#!/usr/bin/env python3
"""Time train.make_batch on this machine: mean and max per batch, and the slowest single sample.

One process, the way one data worker makes batches (the GPU machine runs 12 of them). With a real
vocabulary (a model folder's tokenizer.json and task_words.json, read by hf_bpe.py when the
`tokenizers` package is missing, as in copy_check.py). Numpy is enough; torch is imported by train.py.

  /usr/bin/python3 training/smoke/time_batches.py --model-dir models/needle-llama-11m --mix match
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import copy_check  # noqa: E402  (puts the hf_bpe stand-in in place of a missing `tokenizers`)

train = copy_check.train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="folder with tokenizer.json and task_words.json")
    p.add_argument("--text-dir", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), ".cache", "assets-text"))
    p.add_argument("--mix", default="match")
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--seed", type=int, default=1000)
    a = p.parse_args()
    spec = {"tokenizer": os.path.join(a.model_dir, "tokenizer.json"),
            "task_words": os.path.join(a.model_dir, "task_words.json"), "text_dir": a.text_dir, "train_words": "all"}
    started = time.perf_counter()
    train.make_batch(spec, a.length, 1, a.seed - 1, a.mix)  # loads the tokenizer and the text once
    print(f"worker start-up {time.perf_counter() - started:.2f} s")
    times, sample_max, probe_max = [], 0.0, 0
    for i in range(a.batches):
        _, _, stats = train.make_batch(spec, a.length, a.batch, a.seed + i, a.mix)
        times.append(stats["seconds"])
        sample_max = max(sample_max, stats["sample_seconds_max"])
        probe_max = max(probe_max, stats["probe_tokens_max"])
    mean = sum(times) / len(times)
    print(f"{a.mix} {a.length} x {a.batch}, {a.batches} batches: mean {1e3 * mean:.1f} ms, max {1e3 * max(times):.1f} ms, "
          f"min {1e3 * min(times):.1f} ms per batch ({1 / mean:.1f} batches/s per worker); slowest sample "
          f"{1e3 * sample_max:.1f} ms; largest fit probe {probe_max} tokens")


if __name__ == "__main__":
    main()
