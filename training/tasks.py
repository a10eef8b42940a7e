#!/usr/bin/env python3
"""Synthetic long-context tasks for training and evaluating the project's small model.

Pure Python (no numpy, no tokenizer library): every sample is a deterministic function of a seed,
the word pools (task_words.json, made from the trained vocabulary), the haystack text and a
`measure` callback that says how many tokens a sample takes. TASKS.md is the exact specification;
the C++ `entropyinfer eval` reproduces it, so every random draw below goes through `Rng` (SplitMix64)
in the documented order, and every length computation is integer arithmetic.

Run `python3 training/tasks.py --self-test` to check determinism, lengths and answers with an
approximate token counter; `--show TASK` prints one sample.
"""

import argparse
import glob
import json
import os
import re
import sys

FORMAT_VERSION = 1
MASK64 = (1 << 64) - 1

# ----------------------------------------------------------------------------------------------
# Random numbers: SplitMix64, reproducible in C++ with uint64_t arithmetic.


class Rng:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        """Uniform-enough integer in [0, n): the modulo bias is below 2^-40 for our n."""
        if n <= 0:
            raise ValueError("below() needs n >= 1")
        return self.next_u64() % n

    def sample(self, pool, k):
        """k distinct items of pool, in draw order (partial Fisher-Yates on a copy)."""
        items = list(pool)
        if k > len(items):
            raise ValueError(f"cannot draw {k} distinct items from a pool of {len(items)}")
        for i in range(k):
            j = i + self.below(len(items) - i)
            items[i], items[j] = items[j], items[i]
        return items[:k]

    def shuffle(self, items):
        """In-place Fisher-Yates from the back."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) & MASK64
    return h


def sample_seed(base_seed, task, length, index):
    """Seed of evaluation sample `index` of `task` at `length` tokens."""
    return (base_seed ^ fnv1a64(f"{task}/{length}/{index}")) & MASK64


# ----------------------------------------------------------------------------------------------
# Text formats. Every answer word is one token with its leading space (see task_words.json).

NEEDLE = "The secret of {key} is {value}."
QUESTION_ONE = "What is the secret of {key}? It is"
# Training only: a needle's own opening as the question, so that an induction head (match the
# token before, copy the token after) answers it; see TRAIN_MIXES["recall"].
QUESTION_RECALL = "The secret of {key} is"
# Training only: a needle as its key and value alone on a line, asked by its key alone, so that the
# value is the token right after the key and one induction step (match the key, copy what follows)
# answers it; see TRAIN_MIXES["pairs"].
NEEDLE_PAIR = " {key} {value}."
QUESTION_PAIR = " {key}"
QUESTION_ALL_VALUES = "What are all the secrets of {key}? They are"
QUESTION_MANY_KEYS = "What are the secrets of{keys}? They are"
VT_FIRST = "VAR {name} = {number}"
VT_NEXT = "VAR {name} = VAR {previous}"
QUESTION_VT = "Which variables are assigned the value {number}? They are"
QUESTION_CWE = "What are the {count} most common words in the list above? They are"
QUESTION_FWE = "What are the {count} most frequent words in the list above? They are"
NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
LIST_WORDS_PER_LINE = 10
CWE_COMMON = 10
FWE_TOP = 3

# Segment kinds: what a token is for the training loss.
CONTEXT = 1  # haystack, needles, questions: language-model loss
ANSWER_WORD = 2  # an answer word: the answer loss and accuracy
ANSWER_FORM = 3  # separators and the full stop of an answer: language-model loss

# Generation budget of each evaluation task (tokens after the prompt, including EOS).
GENERATION_TOKENS = {
    "niah_single": 4,
    "niah_multikey": 4,
    "niah_multivalue": 12,
    "niah_multiquery": 12,
    "vt": 12,
    "cwe": 24,
    "fwe": 8,
}
EVAL_TASKS = list(GENERATION_TOKENS)

# Words that would make a question ambiguous or that the templates use.
EXCLUDED_WORDS = {
    "secret", "secrets", "var", "variable", "variables", "value", "values", "word", "words",
    "list", "common", "frequent", "most", "above", "what", "which", "who", "is", "are", "it",
    "they", "the", "of", "and", "all", "assigned", "grass", "sky", "sun", "green", "blue",
    "yellow", "here", "there", "back", "again", "go", "we", "a", "an", "to", "in", "that",
}


class TooLong(Exception):
    """The sample does not fit the length even with an empty haystack."""


class Sample:
    """A task instance: text segments and the expected answer words.

    segments[:prompt_segments] form the evaluation prompt; the remaining segments are the
    reference continuation (an evaluation sample) or further questions and answers (training).
    """

    def __init__(self, task, segments, answers, prompt_segments):
        self.task = task
        self.segments = segments
        self.answers = answers
        self.prompt_segments = prompt_segments

    def prompt(self):
        return "".join(text for text, _ in self.segments[: self.prompt_segments])

    def reference(self):
        return "".join(text for text, _ in self.segments[self.prompt_segments :])

    def full_text(self):
        return "".join(text for text, _ in self.segments)


def answer_segments(words):
    """' a', ' a and b', ' a, b and c', ... then '.', as (text, kind) segments."""
    segments = []
    for i, word in enumerate(words):
        if i > 0:
            segments.append(("," if i < len(words) - 1 else " and", ANSWER_FORM))
        segments.append((" " + word, ANSWER_WORD))
    segments.append((".", ANSWER_FORM))
    return segments


def key_list(words):
    """The same list form inside a question, as one string."""
    return "".join(text for text, _ in answer_segments(words)[:-1])


# ----------------------------------------------------------------------------------------------
# Resources: haystack lines and word pools.


def read_lines(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read().replace("\r\n", "\n").split("\n")


TRAIN_NOVELS = ["emma", "mansfield_park", "northanger_abbey", "pride_and_prejudice", "sense_and_sensibility"]
EVAL_NOVEL = "persuasion"


def train_corpus_lines(text_dir):
    """Training haystack: five Austen novels, the KJV, and bAbI's training stories (statements)."""
    lines = []
    for name in TRAIN_NOVELS:
        lines.extend(read_lines(os.path.join(text_dir, "janeausten", name + ".txt")))
    lines.extend(read_lines(os.path.join(text_dir, "kjv", "kjv_bible.txt")))
    for path in sorted(glob.glob(os.path.join(text_dir, "babi", "en", "qa*_train.txt"))):
        for line in read_lines(path):
            number, _, statement = line.partition(" ")
            if not number.isdigit() or "?" in statement or "|" in statement:
                continue
            if number == "1":
                lines.append("")  # a new story
            lines.append(statement)
    return lines


def eval_corpus_lines(text_dir):
    """Evaluation haystack: Persuasion, never seen in training, split at '\\n'."""
    return read_lines(os.path.join(text_dir, "janeausten", EVAL_NOVEL + ".txt"))


def read_word_list(path):
    words = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            word = line.strip()
            if word:
                words.append(word)
    return words


def build_task_words(ruler_dir, is_single_token, heldout_every=10):
    """Word pools from RULER's wonderwords lists: words that are one token with a leading space.

    is_single_token(text) -> bool says whether `text` (e.g. " apple") encodes to exactly one token.
    """

    def usable(word):
        return word.isascii() and word.isalpha() and word.islower() and word not in EXCLUDED_WORDS

    nouns = sorted({w for w in read_word_list(os.path.join(ruler_dir, "wonderwords_nounlist.txt")) if usable(w)})
    adjectives = sorted(
        {w for w in read_word_list(os.path.join(ruler_dir, "wonderwords_adjectivelist.txt")) if usable(w)}
    )
    nouns = [w for w in nouns if is_single_token(" " + w)]
    adjectives = [w for w in adjectives if is_single_token(" " + w) and w not in set(nouns)]
    keys = nouns[0::2]
    values = sorted(nouns[1::2] + adjectives)
    numbers = [str(n) for n in range(1, 1000) if is_single_token(" " + str(n))]
    return {
        "format": FORMAT_VERSION,
        "description": "Word pools of the synthetic tasks (training/TASKS.md). Every entry is one "
        "token when written with a leading space. Training uses the entries whose index i in "
        "their list has i % heldout_every == heldout_every - 1 never; evaluation uses all.",
        "heldout_every": heldout_every,
        "keys": keys,
        "values": values,
        "numbers": numbers,
    }


class Resources:
    """Everything a task needs besides the seed: haystack lines and word pools."""

    def __init__(self, lines, task_words, part):
        # part: "all" (evaluation), "train" (without held-out words), "heldout" (only those).
        every = task_words["heldout_every"]

        def select(words):
            if part == "all":
                return list(words)
            keep_heldout = part == "heldout"
            return [w for i, w in enumerate(words) if (i % every == every - 1) == keep_heldout]

        self.lines = lines
        self.keys = select(task_words["keys"])
        self.values = select(task_words["values"])
        numbers = select(task_words["numbers"])
        # Too few single-token numbers (an unusual vocabulary): values stand in for them.
        self.numbers = numbers if len(numbers) >= 10 else self.values
        self.list_words = sorted(set(self.keys) | set(self.values))
        if len(self.keys) < 16 or len(self.values) < 16:
            raise ValueError(f"word pools too small: {len(self.keys)} keys, {len(self.values)} values")


# ----------------------------------------------------------------------------------------------
# Fitting a sample to a token budget.


def fit(render, measure, target, k_min, k_max, k_guess):
    """Largest k in [k_min, k_max] with measure(render(k)) <= target, found to within
    tol = max(4, target // 256) tokens: a secant search on the line through (k_min, m(k_min)),
    falling back to bisection after 8 steps. All integer arithmetic (TASKS.md restates it)."""
    tol = max(4, target // 256)
    m_min = measure(render(k_min))
    if m_min > target:
        raise TooLong(f"{m_min} tokens at the smallest size, budget {target}")
    lo, m_lo, hi = k_min, m_min, k_max + 1
    k = k_guess
    for step in range(24):
        if hi - lo <= 1 or target - m_lo <= tol:
            break
        if step >= 8:
            k = (lo + hi) // 2
        k = min(max(k, lo + 1), hi - 1)
        m = measure(render(k))
        if m <= target:
            lo, m_lo = k, m
        else:
            hi = k
        if m > m_min:
            k = k_min + (target - tol // 2 - m_min) * (k - k_min) // (m - m_min)
        else:
            k = 2 * k
    return lo


def haystack_body(lines, start, k, needles):
    """k haystack lines from lines[start] on (wrapping around), with needle lines inserted.

    needles: list of (depth, text), depth in [0, 1000]. A needle goes into gap depth * k // 1000
    (gap g = before haystack line g; gap k = after the last). Within one gap, needles go in
    order of (depth, index in the list)."""
    order = sorted(range(len(needles)), key=lambda i: (needles[i][0], i))
    by_gap = {}
    for i in order:
        by_gap.setdefault(needles[i][0] * k // 1000, []).append(needles[i][1])
    out = []
    n = len(lines)
    for gap in range(k + 1):
        out.extend(by_gap.get(gap, ()))
        if gap < k:
            out.append(lines[(start + gap) % n])
    return "\n".join(out)


def appearance_order(depths):
    return sorted(range(len(depths)), key=lambda i: (depths[i], i))


def make_haystack_sample(task, lines, start, needles, questions, measure, target, noise=False, k_max=None):
    """Fit the number of haystack lines; questions: list of (question text, answer words).
    k_max: the most lines tried (default, as TASKS.md section 4: all lines of the haystack, or
    1000000 noise lines); training passes a bound near the target (see training_max_lines)."""

    def render(k):
        if noise:
            body = haystack_body([NOISE_LINE], 0, k, needles)
        else:
            body = haystack_body(lines, start, k, needles)
        segments = []
        for i, (question, words) in enumerate(questions):
            segments.append(((body + "\n" if i == 0 else "\n") + question, CONTEXT))
            segments.extend(answer_segments(words))
        return Sample(task, segments, list(questions[0][1]), 1)

    if k_max is None:
        k_max = 1_000_000 if noise else len(lines)
    k = fit(render, measure, target, 0, k_max, max(1, target // 16))
    return render(k)


# ----------------------------------------------------------------------------------------------
# List tasks (cwe, fwe): the context is a list of words, LIST_WORDS_PER_LINE a line, every word
# with a leading space.


def list_body(items):
    lines = []
    for i in range(0, len(items), LIST_WORDS_PER_LINE):
        lines.append("".join(" " + w for w in items[i : i + LIST_WORDS_PER_LINE]))
    return "\n".join(lines)


def cwe_items(pool, list_seed, total):
    """RULER's common-words list for about `total` words: CWE_COMMON words appear 10*f times,
    the others f times each, f >= 3 the smallest that the pool allows (RULER: 30 and 3)."""
    distinct_uncommon = len(pool) - CWE_COMMON
    f = max(3, -(-total // (10 * CWE_COMMON + distinct_uncommon)))  # ceiling division
    n_uncommon = max(0, min(distinct_uncommon, (total - 10 * CWE_COMMON * f) // f))
    rng = Rng(list_seed)
    chosen = rng.sample(pool, CWE_COMMON + n_uncommon)
    common = chosen[:CWE_COMMON]
    items = [w for w in common for _ in range(10 * f)] + [w for w in chosen[CWE_COMMON:] for _ in range(f)]
    rng.shuffle(items)
    seen = []
    for w in items:
        if w in common and w not in seen:
            seen.append(w)
    return items, seen


def fwe_items(pool, list_seed, total):
    """Zipf-like list (alpha 2): the word of rank r appears total // (2 r^2) times while that is
    at least 1; rank 1 takes the remainder. Answer: ranks 1..FWE_TOP, most frequent first."""
    counts = []
    r = 1
    while r <= len(pool) and total // (2 * r * r) >= 1:
        counts.append(total // (2 * r * r))
        r += 1
    counts[0] += total - sum(counts)
    rng = Rng(list_seed)
    ranked = rng.sample(pool, len(counts))
    items = [w for w, c in zip(ranked, counts) for _ in range(c)]
    rng.shuffle(items)
    return items, ranked[:FWE_TOP]


def make_list_sample(task, pool, list_seed, measure, target):
    if task == "cwe":
        question = QUESTION_CWE.format(count=CWE_COMMON)
        build, k_min = cwe_items, 10 * CWE_COMMON * 3
    else:
        question = QUESTION_FWE.format(count=FWE_TOP)
        build, k_min = fwe_items, 64

    def render(total):
        items, answer = build(pool, list_seed, total)
        segments = [(list_body(items) + "\n" + question, CONTEXT)] + answer_segments(answer)
        return Sample(task, segments, answer, 1)

    k = fit(render, measure, target, k_min, 8 * target + 1024, target * 10 // 11)
    return render(k)


# ----------------------------------------------------------------------------------------------
# Evaluation samples (TASKS.md): one question each; the prompt must leave GENERATION_TOKENS.


def eval_sample(task, length, index, res, measure, base_seed=0):
    """measure(text) -> tokens of the prompt text (BOS included). The sample fits
    measure(prompt) + GENERATION_TOKENS[task] <= length."""
    rng = Rng(sample_seed(base_seed, task, length, index))
    target = length - GENERATION_TOKENS[task]

    def prompt_measure(sample):
        return measure(sample.prompt())

    if task in ("niah_single", "niah_multikey"):
        n = 1 if task == "niah_single" else 4
        keys = rng.sample(res.keys, n)
        values = rng.sample(res.values, n)
        depths = [rng.below(1001) for _ in range(n)]
        asked = rng.below(n)
        start = rng.below(len(res.lines))
        needles = [(depths[i], NEEDLE.format(key=keys[i], value=values[i])) for i in range(n)]
        questions = [(QUESTION_ONE.format(key=keys[asked]), [values[asked]])]
        return make_haystack_sample(task, res.lines, start, needles, questions, prompt_measure, target)
    if task == "niah_multivalue":
        key = rng.sample(res.keys, 1)[0]
        values = rng.sample(res.values, 4)
        depths = [rng.below(1001) for _ in range(4)]
        start = rng.below(len(res.lines))
        needles = [(depths[i], NEEDLE.format(key=key, value=values[i])) for i in range(4)]
        answer = [values[i] for i in appearance_order(depths)]
        questions = [(QUESTION_ALL_VALUES.format(key=key), answer)]
        return make_haystack_sample(task, res.lines, start, needles, questions, prompt_measure, target)
    if task == "niah_multiquery":
        keys = rng.sample(res.keys, 4)
        values = rng.sample(res.values, 4)
        depths = [rng.below(1001) for _ in range(4)]
        order = rng.sample(range(4), 4)
        start = rng.below(len(res.lines))
        needles = [(depths[i], NEEDLE.format(key=keys[i], value=values[i])) for i in range(4)]
        question = QUESTION_MANY_KEYS.format(keys=key_list([keys[i] for i in order]))
        questions = [(question, [values[i] for i in order])]
        return make_haystack_sample(task, res.lines, start, needles, questions, prompt_measure, target)
    if task == "vt":
        names = rng.sample(res.keys, 5)
        number = rng.sample(res.numbers, 1)[0]
        depths = sorted(rng.below(1001) for _ in range(5))
        needles = vt_statements(names, number, depths)
        questions = [(QUESTION_VT.format(number=number), names)]
        return make_haystack_sample(task, res.lines, 0, needles, questions, prompt_measure, target, noise=True)
    if task in ("cwe", "fwe"):
        list_seed = rng.next_u64()
        return make_list_sample(task, res.list_words, list_seed, prompt_measure, target)
    raise ValueError(f"unknown task {task!r} (known: {', '.join(EVAL_TASKS)})")


def vt_statements(names, number, depths):
    needles = [(depths[0], VT_FIRST.format(name=names[0], number=number))]
    for i in range(1, len(names)):
        needles.append((depths[i], VT_NEXT.format(name=names[i], previous=names[i - 1])))
    return needles


# ----------------------------------------------------------------------------------------------
# Training samples: the evaluation formats with wider parameters, several questions per sample.

# Training mixtures by name: (family, weight, shortest length it is used at). A curriculum stage
# names its mixture (train.py). The first stages teach only single-token retrieval: "one" (a
# single needle, asked: "read the value after `is`" pays off at once, which bootstraps the copy
# circuit), then "copy" (1 needle, 1 to 4 all asked ("niah_few"), or as many as fit, 8 at 256
# tokens, all asked ("niah_all"): several needles force matching the key). With all seven families
# from step 0 a 6-layer model had not started to copy after 900 steps at 256 tokens (round 1),
# while a 2-layer model on CPU fed single needles copies within 300 steps.
TRAIN_MIXES = {
    "one": [("niah_one", 100, 0)],
    "copy": [("niah_one", 30, 0), ("niah_few", 45, 0), ("niah_all", 25, 0)],
    "niah": [("niah", 50, 0), ("niah_few", 20, 0), ("niah_all", 10, 0), ("multiquery", 10, 0), ("multivalue", 10, 0)],
    # Every sample holds several needles and asks for them by key, so answering needs the key to
    # be matched: a model that copies whichever value it finds scores 1/n here.
    "keys": [("niah_all", 50, 0), ("multiquery", 25, 0), ("multivalue", 25, 0)],
    # niah_all asks every needle, so a model that answers with any value not yet given scores
    # (1/n + 1/(n-1) + ... + 1)/n without matching a key: 34% with 8 needles, 8% with 8 of 16
    # asked, which is what the "keys" round reached. niah_match asks a few of many needles, where
    # that elimination gains almost nothing over 1/n. "long_match" keeps single needles beside it
    # for the long stages.
    "match": [("niah_match", 60, 0), ("multivalue", 15, 0), ("multiquery", 15, 0), ("niah_one", 10, 0)],
    "long_match": [("niah_one", 35, 0), ("niah_match", 35, 0), ("multivalue", 15, 0), ("multiquery", 15, 0)],
    # Key matching through an induction head first: niah_recall asks "The secret of KEY is", the
    # needle's own words, so the token before the answer is the key itself. Round 7's fresh model on
    # match_one copied single needles within 1,200 steps but stayed at chance on niah_match through
    # 4,500 more; matching the key three tokens back ("KEY? It is") never began.
    "recall": [("niah_recall", 45, 0), ("niah_match", 25, 0), ("niah_one", 20, 0), ("multiquery", 10, 0)],
    # Key matching as associative recall, the stepping stone of smoke/match_probe.py: needles " KEY
    # VALUE." with as many as fit (4 at 128 tokens) all asked by " KEY". In the probe, matching formed
    # within about 3,500 steps in this form at 29 ids and never in "The secret of KEY is" or at 61-64
    # ids from scratch; once formed it carried over at once to longer rows and to the question form
    # (runs/2026-11-29.md, 2026-12-07). So a fresh model takes it first, in short dense rows.
    "pairs": [("niah_pairs", 100, 0)],
    # The same with keys and values from the first SMALL_PAIRS_POOL words of each pool: in the
    # probe, 72 of each formed matching in about 3,300 steps and 512 of each had not in 12,000.
    "pairs_small": [("niah_pairs_small", 100, 0)],
    # For a fresh model (round 7 on): "match" with four times the single needles. Round 1's mixture,
    # whose 256-token answers were spread over multi-needle families like "match"'s, never started
    # to copy; single needles ("one") did within about 600 steps (round 2). Here both skills get
    # gradient from step 0: copying from the single needles (and 1/n of the rest), key matching
    # from niah_match, without a copy circuit trained alone first (rounds 5 and 6 resumed one and
    # never matched keys).
    "match_one": [("niah_one", 40, 0), ("niah_match", 40, 0), ("multivalue", 10, 0), ("multiquery", 10, 0)],
    "all": [
        ("niah", 50, 0),
        ("niah_all", 10, 0),
        ("multivalue", 10, 0),
        ("multiquery", 10, 0),
        ("vt", 8, 1024),
        ("cwe", 6, 1024),
        ("fwe", 6, 1024),
    ],
}
TRAIN_MIX = TRAIN_MIXES["all"]
SMALL_PAIRS_POOL = 64
NOISE_HAYSTACK_PERCENT = 15


def training_max_lines(length, lines, noise):
    """The most haystack lines a training sample of `length` tokens tries: 2 * length (at most
    every line of the haystack). A line of either haystack holds at least one token unless it is
    blank, and no 64 consecutive training lines are half blank, so 2 * length lines are always
    too many and the fit still finds the largest k. The evaluation's bound (every line, or 10^6
    noise lines) made fit() fall back to bisecting from half the corpus when its secant steps
    crept up from below (1 to 2 samples in 10^4 at 256 and 1024 tokens): one 256-token sample
    then tokenized about 3 million tokens, seconds of a worker, which stalled round 6's queue."""
    return min(1_000_000 if noise else len(lines), 2 * length)


def pick_family(rng, length, mix="all"):
    families = [(name, weight) for name, weight, shortest in TRAIN_MIXES[mix] if length >= shortest]
    roll = rng.below(sum(w for _, w in families))
    for name, weight in families:
        if roll < weight:
            return name
        roll -= weight
    return families[-1][0]


def training_sample(rng, length, res, measure, mix="all"):
    """A training sample of at most `length` tokens by measure(full text), which must count
    BOS and EOS. Retries smaller variants when one does not fit."""
    last_error = None
    for attempt in range(8):
        family = pick_family(rng, length, mix) if attempt < 4 else "niah"
        try:
            return _training_sample(rng, family, length, res, measure, shrink=attempt)
        except TooLong as error:
            last_error = error
    raise TooLong(f"no training sample fits {length} tokens: {last_error}")


def _training_sample(rng, family, length, res, measure, shrink):
    def full_measure(sample):
        return measure(sample.full_text())

    noise = rng.below(100) < NOISE_HAYSTACK_PERCENT
    start = rng.below(len(res.lines))
    lines = res.lines
    max_lines = training_max_lines(length, lines, noise)
    if family in ("niah_match", "niah_recall"):
        # 2..length // 32 needles (at most 16), 1..n // 3 of them asked (at most 3).
        n_max = max(2, min(16, length // 32) >> shrink)
        n = 2 + rng.below(n_max - 1)
        q = 1 + rng.below(max(1, min(3, n // 3)))
        keys = rng.sample(res.keys, n)
        values = rng.sample(res.values, n)
        depths = [rng.below(1001) for _ in range(n)]
        asked = rng.sample(range(n), q)
        needles = [(depths[i], NEEDLE.format(key=keys[i], value=values[i])) for i in range(n)]
        question = QUESTION_ONE if family == "niah_match" else QUESTION_RECALL
        questions = [(question.format(key=keys[i]), [values[i]]) for i in asked]
        return make_haystack_sample(family, lines, start, needles, questions, full_measure, length, noise,
                                    k_max=max_lines)
    if family in ("niah_pairs", "niah_pairs_small"):
        # At least 4 needles, so that short rows are almost all needles and questions.
        n = max(2, max(4, min(16, length // 32)) >> shrink)
        pool = SMALL_PAIRS_POOL if family == "niah_pairs_small" else len(res.keys)
        keys = rng.sample(res.keys[:pool], n)
        values = rng.sample(res.values[:pool], n)
        depths = [rng.below(1001) for _ in range(n)]
        asked = rng.sample(range(n), min(n, 8))
        needles = [(depths[i], NEEDLE_PAIR.format(key=keys[i], value=values[i])) for i in range(n)]
        questions = [(QUESTION_PAIR.format(key=keys[i]), [values[i]]) for i in asked]
        return make_haystack_sample("niah_pairs", lines, start, needles, questions, full_measure, length, noise,
                                    k_max=max_lines)
    if family in ("niah", "niah_all", "niah_few", "niah_one"):
        n_max = max(1, min(16, length // 32) >> shrink)
        # niah_all: as many needles as fit (8 at 256 tokens); niah_few: 1 to 4; both all asked
        # (at most 8 questions).
        if family == "niah_all":
            n = n_max
        elif family == "niah_one":
            n = 1
        elif family == "niah_few":
            n = 1 + rng.below(min(4, n_max))
        else:
            n = 1 + rng.below(n_max)
        keys = rng.sample(res.keys, n)
        values = rng.sample(res.values, n)
        depths = [rng.below(1001) for _ in range(n)]
        q = min(n, 8) if family != "niah" else 1 + rng.below(min(n, 8))
        asked = rng.sample(range(n), q)
        needles = [(depths[i], NEEDLE.format(key=keys[i], value=values[i])) for i in range(n)]
        questions = [(QUESTION_ONE.format(key=keys[i]), [values[i]]) for i in asked]
        return make_haystack_sample("niah", lines, start, needles, questions, full_measure, length, noise,
                                    k_max=max_lines)
    if family == "multivalue":
        m = 2 + rng.below(3)
        distractors = rng.below(4) >> shrink
        keys = rng.sample(res.keys, 1 + distractors)
        values = rng.sample(res.values, m + distractors)
        depths = [rng.below(1001) for _ in range(m + distractors)]
        needles = [(depths[i], NEEDLE.format(key=keys[0], value=values[i])) for i in range(m)]
        needles += [(depths[m + j], NEEDLE.format(key=keys[1 + j], value=values[m + j])) for j in range(distractors)]
        answer = [values[i] for i in appearance_order(depths[:m])]
        questions = [(QUESTION_ALL_VALUES.format(key=keys[0]), answer)]
        return make_haystack_sample("niah_multivalue", lines, start, needles, questions, full_measure, length, noise,
                                    k_max=max_lines)
    if family == "multiquery":
        m = 2 + rng.below(3)
        n = m + (rng.below(5) >> shrink)
        keys = rng.sample(res.keys, n)
        values = rng.sample(res.values, n)
        depths = [rng.below(1001) for _ in range(n)]
        asked = rng.sample(range(n), m)
        needles = [(depths[i], NEEDLE.format(key=keys[i], value=values[i])) for i in range(n)]
        question = QUESTION_MANY_KEYS.format(keys=key_list([keys[i] for i in asked]))
        questions = [(question, [values[i] for i in asked])]
        return make_haystack_sample("niah_multiquery", lines, start, needles, questions, full_measure, length, noise,
                                    k_max=max_lines)
    if family == "vt":
        chains = 1 + (rng.below(2) >> shrink)
        hops = 1 + rng.below(4)
        names = rng.sample(res.keys, chains * (hops + 1))
        numbers = rng.sample(res.numbers, chains)
        needles = []
        for c in range(chains):
            depths = sorted(rng.below(1001) for _ in range(hops + 1))
            needles += vt_statements(names[c * (hops + 1) : (c + 1) * (hops + 1)], numbers[c], depths)
        questions = [(QUESTION_VT.format(number=numbers[0]), names[: hops + 1])]
        use_noise = rng.below(2) == 0
        return make_haystack_sample("vt", lines, start, needles, questions, full_measure, length, use_noise,
                                    k_max=training_max_lines(length, lines, use_noise))
    if family in ("cwe", "fwe"):
        return make_list_sample(family, res.list_words, rng.next_u64(), full_measure, length)
    raise ValueError(family)


# ----------------------------------------------------------------------------------------------
# Scoring (RULER's string_match_all with whole words).

WORD_PATTERN = re.compile(r"[a-z0-9]+")


def score(generated_text, answers):
    """Fraction of expected answer words that appear as whole words in the generated text."""
    words = set(WORD_PATTERN.findall(generated_text.lower()))
    return sum(1.0 for a in answers if a.lower() in words) / len(answers)


# ----------------------------------------------------------------------------------------------
# Self-test with an approximate token counter (one token per GPT-2 pre-token).

PRETOKEN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def approx_tokens(text):
    return len(PRETOKEN.findall(text))


def default_dir(*candidates):
    for path in candidates:
        if os.path.isdir(path):
            return path
    return candidates[-1]


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_text_dir():
    root = repo_root()
    return default_dir(os.path.join(root, ".cache", "assets-text"), os.path.join(root, "..", "shared", "assets", "text"))


def default_ruler_dir(text_dir):
    root = repo_root()
    return default_dir(os.path.join(text_dir, "ruler"), os.path.join(root, "..", "shared", "assets", "ruler"))


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def verify_sample(sample, res_keys_values=None):
    """Structural checks: segments are tokenization-stable and the answers are in the prompt."""
    prompt = sample.prompt()
    for text, kind in sample.segments:
        check(text and not text.endswith(" "), f"segment {text[-40:]!r} ends with a space")
        if kind == ANSWER_WORD:
            check(re.fullmatch(r" [a-z0-9]+", text) is not None, f"answer segment {text!r}")
    task = sample.task
    if task in ("niah_single", "niah_multikey", "niah", "niah_match"):
        key = re.search(r"What is the secret of (\w+)\? It is$", prompt.split("\n")[-1]).group(1)
        check(f"The secret of {key} is {sample.answers[0]}." in prompt, "needle missing")
    elif task == "niah_pairs":
        key = re.fullmatch(r" (\w+)", prompt.split("\n")[-1]).group(1)
        check(f" {key} {sample.answers[0]}." in prompt.split("\n"), "paired needle missing")
    elif task == "niah_recall":
        key = re.search(r"^The secret of (\w+) is$", prompt.split("\n")[-1]).group(1)
        check(f"The secret of {key} is {sample.answers[0]}." in prompt, "recalled needle missing")
    elif task == "niah_multivalue":
        key = re.search(r"secrets of (\w+)\?", prompt.split("\n")[-1]).group(1)
        found = re.findall(rf"^The secret of {key} is (\w+)\.$", prompt, re.M)
        check(found == sample.answers, f"multivalue answers {sample.answers} vs text {found}")
    elif task == "niah_multiquery":
        question = prompt.split("\n")[-1]
        keys = re.findall(r"(\w+)(?:,| and|\?)", question.split("secrets of", 1)[1])
        for key, value in zip(keys, sample.answers):
            check(f"The secret of {key} is {value}." in prompt, f"multiquery needle {key} missing")
        check(len(keys) == len(sample.answers), "multiquery key count")
    elif task == "vt":
        number = re.search(r"the value (\w+)\?", prompt.split("\n")[-1]).group(1)
        names = sample.answers
        check(f"VAR {names[0]} = {number}" in prompt, "vt first statement missing")
        for a, b in zip(names, names[1:]):
            check(f"VAR {b} = VAR {a}" in prompt, "vt chain statement missing")
        positions = [prompt.index(f"VAR {n} =") for n in names]
        check(positions == sorted(positions), "vt statements out of chain order")
    elif task in ("cwe", "fwe"):
        words = " ".join(prompt.split("\n")[:-1]).split()
        counts = {}
        for w in words:
            counts[w] = counts.get(w, 0) + 1
        ranked = sorted(counts.values(), reverse=True)
        top = len(sample.answers)
        check(len(ranked) > top and ranked[top - 1] > ranked[top], "no strict top set")
        check(all(counts[a] >= ranked[top - 1] for a in sample.answers), "answers not the most frequent")
        if task == "fwe":
            check([counts[a] for a in sample.answers] == ranked[:top], "fwe answers not in frequency order")
        else:
            firsts = [words.index(a) for a in sample.answers]
            check(firsts == sorted(firsts), "cwe answers not in order of first appearance")


def self_test(text_dir, ruler_dir):
    import time

    start_time = time.time()
    # A stand-in vocabulary: words among the 2500 most frequent of the corpus count as one token.
    train_lines = train_corpus_lines(text_dir)
    frequency = {}
    for line in train_lines[::3]:
        for word in re.findall(r" ([a-z]+)", line):
            frequency[word] = frequency.get(word, 0) + 1
    common = set(sorted(frequency, key=lambda w: -frequency[w])[:2500])
    digits = {str(n) for n in range(1, 200)}

    def is_single_token(text):
        return text[1:] in common or text[1:] in digits

    words = build_task_words(ruler_dir, is_single_token)
    print(f"pools: {len(words['keys'])} keys, {len(words['values'])} values, {len(words['numbers'])} numbers")
    check(not set(words["keys"]) & set(words["values"]), "keys and values overlap")

    def measure(text):
        return 1 + approx_tokens(text)

    eval_res = Resources(eval_corpus_lines(text_dir), words, "all")
    train_res = Resources(train_lines, words, "train")
    heldout = Resources(eval_res.lines, words, "heldout")
    check(not set(train_res.keys) & set(heldout.keys), "held-out keys leak into training")
    check(len(train_res.keys) + len(heldout.keys) == len(eval_res.keys), "held-out split")

    # Determinism and distinctness.
    a = eval_sample("niah_single", 4096, 3, eval_res, measure)
    b = eval_sample("niah_single", 4096, 3, eval_res, measure)
    c = eval_sample("niah_single", 4096, 4, eval_res, measure)
    check(a.prompt() == b.prompt() and a.answers == b.answers, "eval samples are not deterministic")
    check(a.prompt() != c.prompt(), "different indices give the same sample")
    check(Rng(1).next_u64() == 0x910A2DEC89025CC1, "SplitMix64 reference value")
    check(fnv1a64("") == 0xCBF29CE484222325 and fnv1a64("a") == 0xAF63DC4C8601EC8C, "FNV-1a reference")

    # Every evaluation task at several lengths: fits, close to the budget, answers present.
    for task in EVAL_TASKS:
        for length in (1024, 4096, 16384, 32768):
            for index in range(3):
                sample = eval_sample(task, length, index, eval_res, measure)
                used = measure(sample.prompt()) + GENERATION_TOKENS[task]
                check(used <= length, f"{task} at {length}: {used} tokens")
                check(used >= length * 97 // 100, f"{task} at {length}: only {used} tokens")
                check(len(sample.answers) == {"niah_single": 1, "niah_multikey": 1, "cwe": CWE_COMMON, "fwe": FWE_TOP}.get(task, len(sample.answers)), "answer count")
                verify_sample(sample)
                check(score(sample.reference(), sample.answers) == 1.0, f"{task}: reference does not score 1")
            print(f"  {task:16s} {length:6d}: ok ({len(sample.prompt())} chars, {used} tokens with the generation budget)")

    # Training samples at every curriculum length: fit, stable segments, answers in the text.
    rng = Rng(12345)
    families = {}
    for length in (256, 1024, 4096, 16384, 32768):
        count = 40 if length <= 4096 else 8
        for _ in range(count):
            sample = training_sample(rng, length, train_res, lambda text: 2 + approx_tokens(text))
            check(2 + approx_tokens(sample.full_text()) <= length, f"training sample over {length}")
            families[sample.task] = families.get(sample.task, 0) + 1
            verify_sample(Sample(sample.task, sample.segments, sample.answers, 1))
    print(f"  training families drawn: {families}")
    for mix in TRAIN_MIXES:
        for length in (48, 128, 256, 1024) if mix.startswith("pairs") else (128, 256, 1024):
            for _ in range(20):
                sample = training_sample(rng, length, train_res, lambda text: 2 + approx_tokens(text), mix)
                check(2 + approx_tokens(sample.full_text()) <= length, f"{mix} training sample over {length}")
                verify_sample(Sample(sample.task, sample.segments, sample.answers, 1))
    print(f"  training mixtures {', '.join(TRAIN_MIXES)}: ok")
    # A training fit renders at most training_max_lines(length) haystack lines. A measure that never
    # reaches the target drives fit() to its bound: before round 7 that was the whole corpus (or 10^6
    # noise lines), which is what stalled round 6's data queue when the secant steps crept up.
    for length in (256, 1024):
        for mix in ("match", "match_one", "all"):
            most_lines = [0]

            def flat_measure(text):
                most_lines[0] = max(most_lines[0], text.count("\n") + 1)
                return 10

            for _ in range(10):
                training_sample(rng, length, train_res, flat_measure, mix)
            check(most_lines[0] <= 2 * length + 32, f"{mix} at {length}: fit rendered {most_lines[0]} lines")
    print("  training fits bounded by training_max_lines: ok")
    check(score(" apple, pear and plum.", ["apple", "plum"]) == 1.0, "score")
    check(score(" pineapple", ["apple"]) == 0.0, "score must match whole words")
    print(f"self-test passed in {time.time() - start_time:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--show", metavar="TASK", help="print one evaluation sample (approximate token counts)")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--text-dir", default=None)
    parser.add_argument("--ruler-dir", default=None)
    args = parser.parse_args()
    text_dir = args.text_dir or default_text_dir()
    ruler_dir = args.ruler_dir or default_ruler_dir(text_dir)
    if args.self_test:
        self_test(text_dir, ruler_dir)
    elif args.show:
        words = build_task_words(ruler_dir, lambda text: True)
        res = Resources(eval_corpus_lines(text_dir), words, "all")
        sample = eval_sample(args.show, args.length, args.index, res, lambda text: 1 + approx_tokens(text))
        print(sample.prompt() + "\u2588" + sample.reference())
        print(f"\n[answers: {sample.answers}]", file=sys.stderr)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
