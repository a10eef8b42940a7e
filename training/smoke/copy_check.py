#!/usr/bin/env python3
"""CPU check that the training pipeline can learn to copy: a tiny model trained on the real batches
(train.make_batch, train.batch_loss, train.CausalLM) with a real vocabulary, printing the answer
accuracy every 15 s. Chance is about 1/350 (the training values); a working pipeline climbs well
above it within a few hundred steps on the "copy" mixture.

Needs torch (Debian's python3-torch is enough) and a Hugging Face tokenizer.json plus the
task_words.json made with it (a previous round's model folder: `cat OUT/model.tar.* | tar -x -C DIR`).
Without the `tokenizers` package the file is read by hf_bpe.py (byte-level BPE, exact for ASCII).
One thread and bfloat16 autocast: Debian's torch multiplies float32 with a reference BLAS, 15x slower.

  /usr/bin/python3 training/smoke/copy_check.py --model-dir /tmp/r1/model --mix copy --seconds 180
"""
import argparse
import contextlib
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The script's folder holds the stand-in `tokenizers` of cpu_smoke.sh, which cannot read a real
# tokenizer.json: keep it off the path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    import tokenizers  # noqa: F401
except ImportError:
    import types

    sys.path.append(HERE)
    import hf_bpe  # noqa: E402

    class _Encoding:
        def __init__(self, ids):
            self.ids = ids

    class _Tokenizer:
        @staticmethod
        def from_file(path):
            t = _Tokenizer()
            t.bpe = hf_bpe.BPE(path)
            return t

        def encode(self, text, add_special_tokens=True):
            return _Encoding(([0] if add_special_tokens else []) + self.bpe.encode(text))

        def token_to_id(self, token):
            return self.bpe.vocab.get(token, {"<|begin_of_text|>": 0, "<|end_of_text|>": 1}.get(token))

        def get_vocab_size(self):
            return len(self.bpe.inv)

        def decode(self, ids):
            return self.bpe.decode(ids)

    sys.modules["tokenizers"] = types.SimpleNamespace(Tokenizer=_Tokenizer, __version__="hf_bpe")

import train  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="folder with tokenizer.json and task_words.json")
    p.add_argument("--text-dir", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), ".cache", "assets-text"))
    p.add_argument("--mix", default="copy")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    spec = {"tokenizer": os.path.join(a.model_dir, "tokenizer.json"),
            "task_words": os.path.join(a.model_dir, "task_words.json"), "text_dir": a.text_dir}
    vocab = train.load_tokenizer(spec["tokenizer"]).get_vocab_size()
    cfg = dict(vocab=vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
               head_dim=a.hidden // a.heads, intermediate=3 * a.hidden, rope_theta=1e6, max_position=a.length,
               rms_norm_eps=1e-5)
    model = train.CausalLM(cfg, a.length + 64)
    model.init_weights()
    optimizer = train.make_optimizer(model, {"lr": a.lr, "weight_decay": 0.1}, "cpu")
    loss_args = argparse.Namespace(lm_weight=1.0, answer_weight=1.0)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if hasattr(torch, "autocast") else contextlib.nullcontext()

    start = last = time.time()
    step, window = 0, None
    while time.time() - start < a.seconds:
        ids, kinds, _ = train.make_batch(spec, a.length, a.batch, 1000 + step, a.mix)
        x = torch.from_numpy(ids.astype(np.int64))
        k = torch.from_numpy(kinds.astype(np.int64))
        progress = (time.time() - start) / a.seconds
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, stats = train.batch_loss(model, x, k, loss_args, autocast)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        window = (stats, 1) if window is None else (window[0] + stats, window[1] + 1)
        if time.time() - last >= 15:
            v = window[0].tolist()
            n = len(train.FAMILIES)
            correct, count = v[2 : 2 + n], v[2 + n :]
            families = " ".join(f"{f} {c / m:.3f}" for f, c, m in zip(train.FAMILY_SHORT, correct, count) if m)
            print(f"{time.time() - start:6.1f}s step {step:5d} lr {lr:.1e} lm {v[0] / window[1]:.3f} "
                  f"ans {v[1] / window[1]:.3f} answer accuracy {sum(correct) / max(1, sum(count)):.3f} "
                  f"({int(sum(count))} answers: {families})", flush=True)
            window, last = None, time.time()
    print(f"{step} steps")


if __name__ == "__main__":
    main()
