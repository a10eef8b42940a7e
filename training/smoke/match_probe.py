#!/usr/bin/env python3
"""Which needle formats can a small model learn to match keys in? A study on token ids.

The training rounds (runs/2026-11-29.md, rounds 5-9) copied single needles within about 1,000
steps but never matched a key among several needles, neither through "What is the secret of KEY?
It is" nor through the needle's own opening "The secret of KEY is". This probe takes the text,
the tokenizer and the data workers out: every word is one id of a small vocabulary, the haystack
is random filler ids, and the model is train.CausalLM, so what is left is the format, the depth
and the optimiser. It prints the answer accuracy of each window next to what elimination alone scores (answering
each question with any value not yet given: 1/n, 1/(n-1), ... for the n needles drawn), and by
needle count, so key matching shows as accuracy far above that baseline.
It runs on the GPU when torch has one (scripts/gpu_round.sh, step matchprobe), else on the CPU
(Debian's torch: --hidden 64 --length 64 runs about 8 steps a second on one core).

Formats (--format):
  question  needle "the secret of K is V ." ; question "what is the secret of K ? it is" -> V
  recall    the same needles; question "the secret of K is" -> V
  adjacent  needle "K V ." ; question "K" -> V (associative recall: one induction step)

  /usr/bin/python3 training/smoke/match_probe.py --format recall --layers 2 --seconds 300
"""
import argparse
import collections
import contextlib
import copy
import functools
import itertools
import math
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train  # noqa: E402

# Word ids: structure words first, then filler, keys and values (disjoint ranges).
PAD, BOS, THE, SECRET, OF, IS, DOT, WHAT, QMARK, IT, NEWLINE = range(11)
FILLER = range(16, 16 + 96)
KEYS = range(112, 112 + 72)
VALUES = range(184, 184 + 72)
VOCAB = 256


def set_pool(size):
    """Keys and values drawn from `size` ids each (the training tasks draw from about 450 keys and
    570 values); worker processes are forked after this and inherit it."""
    global KEYS, VALUES, VOCAB
    KEYS = range(112, 112 + size)
    VALUES = range(112 + size, 112 + 2 * size)
    VOCAB = max(256, -(-(112 + 2 * size) // 64) * 64)


FORMATS = ("question", "recall", "adjacent")


def needle(fmt, key, value):
    return [key, value, DOT] if fmt == "adjacent" else [THE, SECRET, OF, key, IS, value, DOT]


def question(fmt, key):
    if fmt == "adjacent":
        return [NEWLINE, key]
    if fmt == "recall":
        return [NEWLINE, THE, SECRET, OF, key, IS]
    return [NEWLINE, WHAT, IS, THE, SECRET, OF, key, QMARK, IT, IS]


def make_sample(rng, fmt, length, min_needles, max_needles, questions):
    """(ids, positions of the answer ids, needle count): at most `length` ids, BOS first."""
    n = rng.randint(min_needles, max_needles)
    keys = rng.sample(KEYS, n)
    values = rng.sample(VALUES, n)
    asked = rng.sample(range(n), min(questions, n))
    tail = []
    answer_at = []
    for i in asked:
        tail += question(fmt, keys[i])
        answer_at.append(len(tail))
        tail += [values[i], DOT]
    body_len = length - 1 - len(tail)
    needles = [needle(fmt, keys[i], values[i]) for i in range(n)]
    filler = body_len - sum(len(x) for x in needles)
    if filler < 0:
        raise ValueError("needles do not fit; lower --max-needles")
    cuts = sorted(rng.randint(0, filler) for _ in range(n))
    body, last = [], 0
    for cut, ids in zip(cuts, needles):
        body += [rng.choice(FILLER) for _ in range(cut - last)] + ids
        last = cut
    body += [rng.choice(FILLER) for _ in range(filler - last)]
    ids = [BOS] + body + tail
    answers = [1 + len(body) + a for a in answer_at]
    return ids, answers, n


def check_samples(fmt, count, length, min_needles, max_needles, questions, seed=0):
    """Wrong samples among `count`: an asked key that the haystack holds other than once, or whose
    needle does not hold the answer at the answer position."""
    key_in_question = {"adjacent": 1, "recall": 2, "question": 4}[fmt]
    value_after_key = 1 if fmt == "adjacent" else 2
    rng = random.Random(seed)
    wrong = 0
    for _ in range(count):
        ids, answers, _ = make_sample(rng, fmt, length, min_needles, max_needles, questions)
        body_end = answers[0] - len(question(fmt, 0))
        for at in answers:
            key = ids[at - key_in_question]
            places = [i for i in range(body_end) if ids[i] == key]
            if len(places) != 1 or ids[places[0] + value_after_key] != ids[at]:
                wrong += 1
                break
    return wrong


def looped_attention(q, k, v, causal):
    """train.attention for Debian's CPU torch, whose batched matmul runs about 40x slower than a
    loop of 2-D products (no MKL)."""
    b, h, t, d = q.shape
    mask = torch.ones(t, t, dtype=torch.bool).triu(1) if causal else None
    q, k, v = (x.reshape(b * h, t, d) for x in (q, k, v))
    rows = []
    for qi, ki, vi in zip(q, k, v):
        scores = (qi @ ki.t()) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        rows.append(scores.softmax(-1) @ vi)
    return torch.stack(rows).view(b, h, t, d)


class ReferenceBlock(torch.nn.Module):
    """A GPT-2 style block: LayerNorm, one fused q/k/v product with biases, GELU MLP."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                                       torch.nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = train.attention(q, k, v, True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        return x + self.mlp(self.norm2(x))


class ReferenceLM(torch.nn.Module):
    """A control model that shares nothing with train.CausalLM but the attention function: learned
    absolute positions instead of RoPE, LayerNorm instead of RMSNorm, GELU instead of SwiGLU, an
    untied classifier, full multi-head attention. If it matches keys where CausalLM does not, the
    difference is in the model; if neither does, it is in the task or the recipe."""

    def __init__(self, vocab, hidden, layers, heads, length):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(length, hidden)
        self.blocks = torch.nn.ModuleList(ReferenceBlock(hidden, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab)
        for param in self.parameters():
            if param.dim() >= 2:
                torch.nn.init.normal_(param, std=0.02)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_repeat_sample(rng, length, alphabet, varied):
    """A random passage over `alphabet` filler ids, then the same passage again: every id of the
    second copy is predictable by matching what came before it, and with a small alphabet only a
    match on several ids is unambiguous (how induction heads form on repeated text). `varied`
    draws the passage's length (a quarter to half the row) and a lead of filler before it, so
    that the copy lies at a different distance in every row and no fixed-offset head predicts it."""
    if varied:
        half = rng.randint(max(2, (length - 1) // 4), (length - 1) // 2)
        lead = [FILLER[rng.randrange(alphabet)] for _ in range(rng.randint(0, length - 1 - 2 * half))]
    else:
        half, lead = (length - 1) // 2, []
    passage = [FILLER[rng.randrange(alphabet)] for _ in range(half)]
    start = 1 + len(lead) + half
    return [BOS] + lead + passage + passage, list(range(start + 1, start + half))


def elimination_hits(needles, questions):
    """Expected right answers of a model that matches no key but answers each question with a
    value not yet given as an answer: 1/n, then 1/(n-1), ... (the questions are answered in turn)."""
    return sum(1 / (needles - j) for j in range(min(questions, needles)))


def make_batch(a, seed):
    """(rows padded to a.length, answer positions per row, needle count per needle row): the
    repeated passages first, then the needle rows."""
    rng = random.Random(seed)
    batch, answer_pos, needles = [], [], []
    repeats = round(a.batch * a.repeat_share)
    for row in range(a.batch):
        if row < repeats:
            ids, answers = make_repeat_sample(rng, a.length, a.repeat_alphabet, a.repeat_varied)
        else:
            ids, answers, n = make_sample(rng, a.format, a.length, a.min_needles, a.max_needles, a.questions)
            needles.append(n)
        batch.append(ids + [PAD] * (a.length - len(ids)))
        answer_pos.append(answers)
    return batch, answer_pos, needles


def prefetched(pool, job, seeds, depth):
    """job(seed) for each seed, in order, with at most `depth` batches made ahead (Pool.imap would
    run ahead without bound and hold every batch the trainer has not yet taken)."""
    pending = collections.deque(pool.apply_async(job, (next(seeds),)) for _ in range(depth))
    while True:
        result = pending.popleft().get()
        pending.append(pool.apply_async(job, (next(seeds),)))
        yield result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=FORMATS, default="question")
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--min-needles", type=int, default=2)
    p.add_argument("--max-needles", type=int, default=6)
    p.add_argument("--questions", type=int, default=2)
    p.add_argument("--pool", type=int, default=72, help="ids that keys, and values, are drawn from")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--model", choices=["llama", "reference"], default="llama",
                   help="train.CausalLM, or ReferenceLM (a GPT-2 style control that shares none of its parts)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--curriculum", default="",
                   help="later stages after --format and --length: comma-separated LENGTH or FORMAT:LENGTH, each "
                        "taken once the accuracy of the stage before first passes halfway from elimination to 1 "
                        "(e.g. 40,64 or recall:61)")
    p.add_argument("--constant-lr", action="store_true",
                   help="hold the lr after warmup (the cosine's decay can end a short run before matching forms)")
    p.add_argument("--lm-weight", type=float, default=0.0,
                   help="weight of the next-token loss on every non-answer id (the needles' words are predictable)")
    p.add_argument("--repeat-share", type=float, default=0.0,
                   help="share of the batch that is a repeated random passage (loss on its second copy)")
    p.add_argument("--repeat-alphabet", type=int, default=16, help="filler ids a repeated passage draws from")
    p.add_argument("--repeat-varied", action="store_true",
                   help="repeated passages of random length after a random lead (no fixed copy distance)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="CPU threads")
    p.add_argument("--workers", type=int, default=None,
                   help="processes making batches (default: 8 on a GPU, at most the spare cores; 0 on the CPU)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--report-seconds", type=float, default=20)
    p.add_argument("--check-data", type=int, default=0, metavar="N",
                   help="check N samples of the format (each asked key once in the haystack, its needle "
                        "holding the answer) and exit")
    p.add_argument("--sweep", default="",
                   help="run one probe per ';'-separated set of extra arguments, each for --seconds, and "
                        "print a table last, e.g. '--format recall;--format question --layers 4'")
    return p.parse_args(argv)


def parse_curriculum(text, fmt):
    """[(format, length)] of --curriculum's stages; a stage without a format keeps the one before."""
    stages = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, length = item.rpartition(":")
        fmt = name or fmt
        if fmt not in FORMATS or not length.isdigit():
            raise SystemExit(f"--curriculum: '{item}' is not LENGTH or FORMAT:LENGTH (formats: {', '.join(FORMATS)})")
        stages.append((fmt, int(length)))
    return stages


def run_probe(a, label=""):
    """Train one model; returns (steps, final window accuracy, its elimination baseline, first step above)."""
    torch.manual_seed(a.seed)
    set_pool(a.pool)
    stages = [(a.format, a.length)] + parse_curriculum(a.curriculum, a.format)
    longest = max(length for _, length in stages)
    cfg = dict(vocab=VOCAB, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
               head_dim=a.hidden // a.heads, intermediate=3 * a.hidden, rope_theta=a.rope_theta,
               max_position=longest, rms_norm_eps=1e-5)
    if a.model == "reference":
        model = ReferenceLM(VOCAB, a.hidden, a.layers, a.heads, longest).to(a.device)
    else:
        model = train.CausalLM(cfg, longest).to(a.device)
        model.init_weights()
    optimizer = train.make_optimizer(model, {"lr": a.lr, "weight_decay": 0.1}, a.device)
    cuda = a.device.startswith("cuda")
    print(f"{label}{a.model} model, format {' then '.join(f'{f} in {n} ids' for f, n in stages)}, {a.layers} layers x "
          f"{a.hidden}, {sum(x.numel() for x in model.parameters())} parameters, {a.min_needles}-{a.max_needles} "
          f"needles, {a.device}"
          + (f", {a.repeat_share:.0%} repeated passages over {a.repeat_alphabet} ids" if a.repeat_share else ""),
          flush=True)
    # Batches are made by worker processes where there are cores to spare (the GPU outruns one
    # Python process making 512 samples a step); each batch has its own seed either way.
    seeds = ((a.seed << 32) + i for i in itertools.count())
    pool = multiprocessing.Pool(a.workers) if a.workers > 0 else None

    def batches_of(fmt, length):
        at_stage = copy.copy(a)
        at_stage.format, at_stage.length = fmt, length
        job = functools.partial(make_batch, at_stage)
        return prefetched(pool, job, seeds, 2 * a.workers) if pool else map(job, seeds)

    stage = 0  # index into stages
    batches = batches_of(*stages[stage])
    passed = []  # first step halfway from elimination to 1, per stage passed
    start = last = time.time()
    step = 0
    # Right answers and answers by needle count, and what elimination would get right, per window.
    by_needles = torch.zeros(2, a.max_needles + 1)
    repeat_hits = [0, 0]  # right predictions and predictions on the repeated passages' second copy
    baseline_hits = 0.0
    accuracy = base = 0.0
    while time.time() - start < a.seconds:
        batch, answer_pos, needles = next(batches)
        repeats = len(batch) - len(needles)
        x = torch.tensor(batch)
        answer_mask = torch.zeros(x.shape, dtype=torch.bool)
        for row, answers in enumerate(answer_pos):
            for pos in answers:
                answer_mask[row, pos - 1] = True  # the logits at pos - 1 predict the id at pos
        x, answer_mask = x.to(a.device), answer_mask.to(a.device)
        inputs, targets = x[:, :-1], x[:, 1:]
        answer_mask = answer_mask[:, :-1]
        lm_mask = (~answer_mask) & (targets != PAD)
        progress = (time.time() - start) / a.seconds
        decay = 1.0 if a.constant_lr else 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * decay
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            logits = model(inputs)
        ce = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
        ce = ce.view(targets.shape)
        needle_rows = torch.arange(answer_mask.shape[0], device=a.device).unsqueeze(1) >= repeats
        answer_loss = ce[answer_mask & needle_rows].mean()
        loss = answer_loss + a.lm_weight * ce[lm_mask].mean()
        if repeats:  # its own mean, so that the needles' few answers are not outweighed
            loss = loss + ce[answer_mask & ~needle_rows].mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        row_needles = torch.tensor(needles).unsqueeze(1).expand(-1, targets.shape[1])
        right = (logits.argmax(-1) == targets)[repeats:][answer_mask[repeats:]]
        answer_needles = row_needles[answer_mask[repeats:].cpu()]
        by_needles[0] += torch.bincount(answer_needles, weights=right.float().cpu(), minlength=a.max_needles + 1)
        by_needles[1] += torch.bincount(answer_needles, minlength=a.max_needles + 1).float()
        if repeats:
            repeat_right = (logits.argmax(-1) == targets)[:repeats][answer_mask[:repeats]]
            repeat_hits[0] += int(repeat_right.sum().item())
            repeat_hits[1] += repeat_right.numel()
        baseline_hits += sum(elimination_hits(n, a.questions) for n in needles)
        if time.time() - last >= a.report_seconds:
            hits, count = by_needles.sum(dim=1).tolist()
            accuracy, base = hits / count, baseline_hits / count
            print(f"{label}{time.time() - start:6.1f}s step {step:6d} "
                  + (f"{stages[stage][0]} {stages[stage][1]} " if len(stages) > 1 else "") + f"lr {lr:.1e} answer loss "
                  f"{answer_loss.item():.3f} accuracy {accuracy:.3f} (elimination {base:.3f}; by needles "
                  + " ".join(f"{n}: {r / m:.2f}" for n, (r, m) in enumerate(by_needles.t().tolist()) if m)
                  + ")" + (f"; repeated passages {repeat_hits[0] / repeat_hits[1]:.3f}" if repeat_hits[1] else ""),
                  flush=True)
            if accuracy > (1 + base) / 2 and len(passed) == stage:  # halfway from elimination to 1
                passed.append(step)
                if stage + 1 < len(stages):
                    stage += 1
                    if pool:  # batches already made are of the stage before
                        pool.terminate()
                        pool = multiprocessing.Pool(a.workers)
                    batches = batches_of(*stages[stage])
                    print(f"{label}next stage at step {step}: {stages[stage][0]} in {stages[stage][1]} ids",
                          flush=True)
            baseline_hits = 0.0
            by_needles.zero_()
            repeat_hits = [0, 0]
            last = time.time()
    if pool:
        pool.terminate()
    first_above = passed[-1] if len(passed) == len(stages) else None
    if len(stages) > 1:
        print(f"{label}halfway from elimination to 1: "
              + ", ".join(f"{f} in {n} ids at step {at}" for (f, n), at in zip(stages, passed)), flush=True)
    print(f"{label}{step} steps; accuracy first halfway from elimination to 1 at step {first_above}"
          + (" (in the last stage)" if len(stages) > 1 else ""), flush=True)
    return step, accuracy, base, first_above


def main():
    a = parse_args()
    if a.check_data:
        set_pool(a.pool)
        wrong = check_samples(a.format, a.check_data, a.length, a.min_needles, a.max_needles, a.questions)
        print(f"{a.format}: {wrong} of {a.check_data} samples wrong")
        sys.exit(1 if wrong else 0)
    if a.workers is None:
        a.workers = min(8, (os.cpu_count() or 1) - 1) if a.device.startswith("cuda") else 0
    torch.set_num_threads(a.threads)
    if not hasattr(F, "scaled_dot_product_attention"):
        train.attention = looped_attention
    if not a.sweep:
        run_probe(a)
        return
    argv = sys.argv[1:]
    rows = []
    for i, extra in enumerate(x.strip() for x in a.sweep.split(";")):
        probe = parse_args(argv + extra.split())
        probe.sweep = ""
        probe.workers = a.workers
        rows.append((extra, run_probe(probe, f"[{i}] ")))
    print("\n| probe | steps | last accuracy | elimination baseline | first step halfway from elimination to 1 |")
    print("|---|---:|---:|---:|---:|")
    for extra, (steps, accuracy, base, first) in rows:
        print(f"| `{extra}` | {steps} | {accuracy:.3f} | {base:.3f} | {first if first is not None else '-'} |")


if __name__ == "__main__":
    main()
