#!/usr/bin/env python3
"""Mutation check of the engine's wiring, the attention policies and the samplers: each mutant below
is one deliberate bug, applied alone to a copy of the tracked sources, built incrementally, and run
against the CPU suite (`ctest -LE gpu`, stopping at the first failure). A mutant the suite fails on
is killed; one it passes survives and needs a test, or a reason it is equivalent.

  scripts/mutation_check.py [--work DIR] [--only ID,ID] [--markdown FILE] [--jobs N] [--list]
                            [--gpu] [--cmake-arg ARG ...]

Mutants marked `gpu` change the CUDA executor's host code; they run only with --gpu, on a machine
with a GPU, against the GPU suite instead. Each line of output is one mutant as it finishes.
"""
import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, file, exact text, replacement, what the bug is). The text must occur exactly once.
MUTANTS = [
    # Engine wiring (CPU executor).
    ("wire-sparse-dense", "src/engine/cpu_executor.cpp",
     "      done = true;\n    } else {",
     "      done = false;\n    } else {",
     "sparse prefill computes dense attention but reports the sparse kernel's reads"),
    # Batched decode, the page pool and the serving scheduler.
    ("batch-rope-first-row", "src/engine/cpu_executor.cpp",
     "rope[i] = rope_tables(c, sequences[i]->schedule.position(), 1);",
     "rope[i] = rope_tables(c, sequences[0]->schedule.position(), 1);",
     "every row of a decode batch is rotated at the first sequence's position"),
    ("batch-decode-per-query-head-append", "src/engine/cpu_executor.cpp",
     "static_cast<int64_t>(head / source_group) * head_dim;",
     "static_cast<int64_t>(head % c.num_kv_heads) * head_dim;",
     "decode appends a per-query-head cache's token from the wrong KV head"),
    ("pool-never-released", "src/engine/cpu_executor.cpp",
     "    if (pool != nullptr) pool->release(pages);\n    pages = new_pages;",
     "    pages += new_pages;",
     "a cache that moves to a new slab keeps the old slab's pages charged"),
    ("pool-compressed-room", "src/engine/cpu_executor.cpp",
     "const int room = s.pool != nullptr ? rest : std::min(kCacheHeadroom, rest);",
     "const int room = s.pool != nullptr ? rest + 64 : std::min(kCacheHeadroom, rest);",
     "a compressed cache holds more rows than its reservation"),
    ("serve-admit-past-pool", "src/serve/scheduler.cpp",
     "reserved + queue_.front().pages <= pool_shape_.pages_total",
     "queue_.front().pages <= pool_shape_.pages_total",
     "admission ignores what the running requests reserve"),
    ("serve-cancel-ignored", "src/serve/scheduler.cpp",
     "if (a->stream->cancelled()) finish(*a, FinishReason::kCancelled, {});",
     "if (false && a->stream->cancelled()) finish(*a, FinishReason::kCancelled, {});",
     "a cancelled request keeps decoding (and holding its pages)"),
    ("serve-feed-wrong-token", "src/serve/scheduler.cpp",
     "  a.next_token = token;",
     "  a.next_token = a.request.prompt.back();",
     "each decode step feeds the prompt's last token instead of the sampled one"),
    ("prefill-budget-ignored", "src/engine/cpu_batch_model.cpp",
     "} while (spent < input.prefill_budget && !executor_.span_layers_done(*entry.job));",
     "} while (false && !executor_.span_layers_done(*entry.job));",
     "a step runs one prefill layer whatever its budget"),
    ("prefill-work-attention-free", "src/engine/prefill_work.cpp",
     "  return per_key_ * (b * (b + 1) - a * (a + 1)) / 2;",
     "  return per_key_ * (b - a);",
     "attention is costed as one key per query, so long prompts take huge slices"),
    ("serve-budget-swapped", "src/serve/scheduler.cpp",
     "decoding.empty() ? options_.prefill_token_layers_per_step",
     "decoding.empty() ? options_.prefill_token_layers_while_decoding",
     "the small prefill budget applies when nothing decodes"),
    ("serve-wait-ignored", "src/serve/scheduler.cpp",
     "        decoding.clear();",
     "        (void)0;",
     "a small decode batch decodes beside every prefill step instead of waiting"),
    ("serve-wait-any-batch", "src/serve/scheduler.cpp",
     "static_cast<int>(decoding.size()) < options_.decode_wait_batch) {",
     "static_cast<int>(decoding.size()) <= options_.decode_wait_batch) {",
     "a decode batch as large as the wait batch still sits out prefill steps"),
    ("serve-wait-endless", "src/serve/scheduler.cpp",
     "      if (waited < options_.decode_wait_steps) {",
     "      if (waited >= 0) {",
     "a small decode batch waits until the prefill ends, whatever its limit"),
    # The sequence schedule both executors follow.
    ("schedule-compress-late", "src/engine/sequence_schedule.cpp",
     "tokens_since_prefill_ >= compress_after_",
     "tokens_since_prefill_ > compress_after_",
     "decode compression happens one generated token late"),
    ("schedule-window-short", "src/engine/sequence_schedule.cpp",
     "return std::min(window_, position_);",
     "return std::min(window_ - 1, position_);",
     "the observation window leaves out its oldest query"),
    ("kernel-count-own-segment", "src/backends/cpu/block_sparse_attention.cpp",
     "keys_read += tokens * (first_token - start) + tokens * (tokens + 1) / 2;",
     "keys_read += tokens * (tokens + 1) / 2;",
     "the sparse kernel leaves its segment's earlier tiles out of the keys it read"),
    ("wire-per-query-head-append", "src/engine/cpu_executor.cpp",
     "(t * c.num_kv_heads + head / source_group) * head_dim",
     "(t * c.num_kv_heads + head % c.num_kv_heads) * head_dim",
     "per-query-head caches append new tokens from the wrong KV head"),
    ("wire-window-first", "src/engine/cpu_executor.cpp",
     "std::memcpy(ring.data() + kept_old * width, queries + (count - incoming) * width,",
     "std::memcpy(ring.data() + kept_old * width, queries,",
     "the observation window takes the first queries of a span instead of the last"),
    ("wire-keys-read", "src/engine/cpu_executor.cpp",
     "      s.work.prefill_keys_read +=\n          cpu::block_sparse_attention(",
     "      s.work.prefill_keys_read += plan.keys_read_dense();\n      cpu::block_sparse_attention(",
     "a sparse prefill reports dense reads"),
    ("wire-embedding-row", "src/engine/cpu_executor.cpp",
     "widen_row(job->tokens[t], job->hidden.data()",
     "widen_row(job->tokens[0], job->hidden.data()",
     "every position embeds the first token"),
    # Entropy prefill.
    ("entropy-rank-1.5x", "src/attention/entropy_prefill.cpp",
     "with_entropy ? static_cast<double>(params.budget_cap_factor) * params.base_budget",
     "with_entropy ? 1.5 * params.base_budget",
     "ranked blocks truncated at 1.5x the base budget"),
    ("entropy-log-epsilon", "src/attention/entropy_prefill.cpp",
     "entropy -= p * std::log(p + 1e-9);",
     "entropy -= p * std::log(p + 1e-3);",
     "entropy with a large epsilon"),
    ("entropy-no-share", "src/attention/entropy_prefill.cpp",
     "for (int h = 0; h < kv_heads; ++h) budgets[h * num_segments + s] = shared;",
     "for (int h = 0; h < kv_heads; ++h) budgets[h * num_segments + s] += 0;",
     "--share-segment-budget ignored"),
    ("budget-ratio-ceiling", "src/attention/entropy_budget.h",
     "ratio = clamp(ratio, 0.0, 1.0 + delta);",
     "ratio = clamp(ratio, 0.0, 2.0 + delta);",
     "the entropy ratio clamped too high"),
    ("budget-first-ratio", "src/attention/entropy_budget.h",
     "if (segment >= 2) ratio",
     "if (segment >= 1) ratio",
     "segment 1 takes an entropy ratio instead of delta"),
    ("budget-blocks-ceil", "src/attention/entropy_budget.h",
     "static_cast<int64_t>(floor(budget_tokens / block_size))",
     "static_cast<int64_t>(ceil(budget_tokens / block_size))",
     "budgets round up to whole blocks"),
    # Decode policies.
    ("window-scores-causal", "src/attention/window_scores.cpp",
     "const int64_t seen = first_position + i + 1;  // keys 0 .. own position",
     "const int64_t seen = first_position + i + 2;  // keys 0 .. own position",
     "window queries see one key past their own position"),
    ("window-scores-first-position", "src/attention/window_scores.cpp",
     "const int64_t first_position = length - window;  // cache position of window query 0",
     "const int64_t first_position = length - window - 1;  // cache position of window query 0",
     "window queries placed one position early"),
    ("pooling-off-by-one", "src/attention/window_scores.cpp",
     "for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(count - 1, i + half); ++j) {\n"
     "          largest",
     "for (int64_t j = std::max<int64_t>(0, i - half); j < std::min(count - 1, i + half); ++j) {\n"
     "          largest",
     "max pooling leaves out its last neighbour"),
    ("gqa-aggregation-first", "src/attention/window_scores.cpp",
     "const float value = pooled[(kv_head * group + g) * candidates + j];",
     "const float value = pooled[(kv_head * group) * candidates + j];",
     "GQA aggregation reads only the group's first query head"),
    ("streaming-sinks", "src/attention/streaming_llm.cpp",
     "for (int64_t position = 0; position < selection.sinks; ++position)",
     "for (int64_t position = 1; position <= selection.sinks; ++position)",
     "StreamingLLM's sinks shifted by one"),
    ("streaming-recent", "src/attention/streaming_llm.cpp",
     "for (int64_t position = length - selection.recent; position < length; ++position) {",
     "for (int64_t position = length - selection.recent - 1; position < length - 1; ++position) {",
     "StreamingLLM's recent entries shifted by one"),
    ("adakv-floor", "src/attention/adakv.cpp",
     "floor_per_head = std::clamp<int64_t>(floor_per_head, 0, candidate_budget);",
     "floor_per_head = 0;",
     "AdaKV without its per-head floor"),
    ("adakv-shared", "src/attention/adakv.cpp",
     "const int64_t shared = static_cast<int64_t>(heads) * (candidate_budget - floor_per_head);",
     "const int64_t shared = static_cast<int64_t>(heads) * (candidate_budget - floor_per_head) / 2;",
     "AdaKV grants half its shared budget"),
    # The selection counts every executor and the memory planner share.
    ("selection-keep-one-more", "src/attention/decode_selection.cpp",
     "s.keep = std::clamp<int64_t>(budget - s.window, 0, s.candidates);",
     "s.keep = std::clamp<int64_t>(budget - s.window + 1, 0, s.candidates);",
     "the top-candidate methods keep one candidate more than their budget"),
    ("selection-adakv-no-floor", "src/attention/decode_selection.cpp",
     "s.keep = std::clamp<int64_t>(floor_per_head, 0, candidate_budget);",
     "s.keep = 0;",
     "AdaKV's shared selection ignores the per-head floor"),
    ("selection-longest-list", "src/attention/decode_selection.cpp",
     "return std::min(candidates, keep + shared) + window;",
     "return keep + window;",
     "the longest list of an AdaKV plan is taken to be a head's floor"),
    ("pyramid-step", "src/attention/pyramidkv.cpp",
     "return largest - clamped_layer * step + window;",
     "return largest - (num_layers - 1 - clamped_layer) * step + window;",
     "PyramidKV's budgets grow with depth instead of shrinking"),
    # Samplers and generation.
    ("sampler-temperature", "src/engine/sampler.cpp",
     "candidates_.emplace_back(logits[i] / options_.temperature, static_cast<int32_t>(i));",
     "candidates_.emplace_back(logits[i], static_cast<int32_t>(i));",
     "the standard sampler ignores the temperature"),
    ("sampler-top-p-reach", "src/engine/sampler.cpp",
     "if (cumulative >= options_.top_p) {",
     "if (cumulative > options_.top_p + 0.05) {",
     "the nucleus keeps more than top_p needs"),
    ("sampler-top-k", "src/engine/sampler.cpp",
     "keep = static_cast<size_t>(options_.top_k);",
     "keep = static_cast<size_t>(options_.top_k) + 1;",
     "top-k keeps one token too many"),
    ("sampler-llama2c-temperature", "src/engine/sampler.cpp",
     "for (float& logit : logits) logit /= options_.temperature;",
     "for (float& logit : logits) logit *= 1.0f;",
     "llama2.c's sampler ignores the temperature"),
    ("generate-argmax-always", "src/engine/generation.cpp",
     "options.sampler.temperature == 0.0f && tokenizer_vocab >= model.config().vocab_size",
     "tokenizer_vocab >= model.config().vocab_size",
     "generation takes the argmax even when it should sample"),
    ("generate-vocab", "src/engine/generation.cpp",
     "const size_t sampled_ids = std::min(logits.size(), static_cast<size_t>(tokenizer_vocab));",
     "const size_t sampled_ids = logits.size();",
     "ids the tokenizer lacks may be sampled"),
    ("generate-stop-token", "src/engine/generation.cpp",
     "result.stop_reason = \"stop token\";\n      break;",
     "result.stop_reason = \"stop token\";",
     "stop tokens do not stop generation"),
    # The CUDA executor's host code (run with --gpu on a GPU machine).
    ("gpu-window-first", "src/engine/cuda/cuda_transformer.cu",
     "ring + slot * w.q, sizeof(bf16) * w.q, q + row * q_stride,",
     "ring + slot * w.q, sizeof(bf16) * w.q, q + (row - skip) * q_stride,",
     "gpu: the observation window takes the first queries of a span instead of the last"),
    ("gpu-kernel-count-dropped", "src/engine/cuda/cuda_transformer.cu",
     "stream, FlashKernel::kAuto, key_counters.data());",
     "stream, FlashKernel::kAuto, nullptr);",
     "gpu: sparse layers' keys read are not counted"),
    ("gpu-slice-skips-queries", "src/engine/cuda/cuda_transformer.cu",
     "    shape.first_position = first;\n",
     "    shape.first_position = 0;\n",
     "gpu: every attention slice of a served prompt attends as if it began the prompt"),
    ("gpu-upload-order", "src/engine/cuda/cuda_transformer.cu",
     "uploader.upload(source.up_proj, layer.gate_up.data() + w.intermediate * w.hidden);",
     "uploader.upload(source.gate_proj, layer.gate_up.data() + w.intermediate * w.hidden);",
     "gpu: the up projection's rows are the gate's"),
]
GPU_FILES = ("src/backends/cuda/", "src/engine/cuda/")


def is_gpu(mutant):
    return mutant[1].startswith(GPU_FILES)


def run(command, cwd, log, timeout=None):
    with open(log, "w") as out:
        return subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout).returncode


def first_failure(log):
    for line in open(log, errors="replace"):
        if "***Failed" in line or "***Exception" in line or "***Timeout" in line:
            return line.split(":", 1)[-1].split("...")[0].strip()
    return "(see log)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/entropyinfer-mutants")
    parser.add_argument("--only", help="comma-separated mutant ids")
    parser.add_argument("--markdown", help="write the table here too")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--gpu", action="store_true", help="also the gpu mutants, on the GPU suite")
    parser.add_argument("--list", action="store_true", help="check and list the mutants, run none")
    parser.add_argument("--cmake-arg", action="append", default=[],
                        help="passed to cmake when the copy is configured (repeatable)")
    args = parser.parse_args()

    chosen = [m for m in MUTANTS if not args.only or m[0] in args.only.split(",")]
    for mutant_id, path, old, _, _ in chosen:
        count = open(os.path.join(ROOT, path)).read().count(old)
        if count != 1:
            sys.exit(f"mutant {mutant_id}: its text occurs {count} times in {path}, not once")
    if args.list:
        for mutant in chosen:
            print(f"{mutant[0]:30} {'gpu ' if is_gpu(mutant) else ''}{mutant[1]}: {mutant[4]}")
        print(f"{len(chosen)} mutants, every one applies")
        return 0

    source = os.path.join(args.work, "src")
    build = os.path.join(source, "build")
    os.makedirs(args.work, exist_ok=True)
    # The tree as it is now (build outputs, caches and git's own files left out), over any earlier
    # copy. Only files whose content differs are written, with the current time (so the copy's
    # build redoes exactly what changed); the others keep their times.
    skipped = {".git", ".cache", ".deps", "__pycache__"}
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in skipped and not d.startswith("build")
                         and os.path.join(folder, d) != os.path.abspath(args.work)]
        for name in names:
            origin = os.path.join(folder, name)
            target = os.path.join(source, os.path.relpath(origin, ROOT))
            if os.path.exists(target) and filecmp.cmp(origin, target, shallow=False):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(origin, target)
            shutil.copymode(origin, target)
    cache = os.path.join(ROOT, ".cache")
    if os.path.isdir(cache) and not os.path.exists(os.path.join(source, ".cache")):
        os.symlink(cache, os.path.join(source, ".cache"))
    # The tests read the shared assets at ../shared from the source tree; without them the copy's
    # suite would skip the llama2c and tokenizer references.
    shared = os.path.join(os.path.dirname(ROOT), "shared")
    if os.path.isdir(shared) and not os.path.exists(os.path.join(args.work, "shared")):
        os.symlink(shared, os.path.join(args.work, "shared"))
    configure = ["cmake", "-S", source, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"]
    if args.gpu:
        configure.append("-DENTROPYINFER_CUDA=ON")
    configure += args.cmake_arg
    logs = os.path.join(args.work, "logs")
    os.makedirs(logs, exist_ok=True)
    print(f"mutation check: building the unmutated copy in {build}", flush=True)
    if run(configure, source, os.path.join(logs, "configure.log")) != 0 or \
            run(["ninja", "-C", build, f"-j{args.jobs}"], source,
                os.path.join(logs, "build.log")) != 0:
        sys.exit(f"the unmutated copy does not build: {logs}/build.log")
    label = ["-L", "gpu"] if args.gpu else ["-LE", "gpu"]
    if run(["ctest", "--test-dir", build, f"-j{args.jobs}"] + label, source,
           os.path.join(logs, "baseline.log"), timeout=1800) != 0:
        sys.exit(f"the unmutated copy fails its own suite: {logs}/baseline.log")

    rows = []
    for mutant_id, path, old, new, what in chosen:
        if is_gpu((mutant_id, path)) and not args.gpu:
            rows.append((mutant_id, what, "not run (gpu)", ""))
            print(f"mutation check: {mutant_id:30} not run (needs --gpu)", flush=True)
            continue
        target = os.path.join(source, path)
        original = open(target).read()
        start = time.time()
        try:
            with open(target, "w") as out:
                out.write(original.replace(old, new, 1))
            log = os.path.join(logs, f"{mutant_id}.log")
            if run(["ninja", "-C", build, f"-j{args.jobs}"], source, log) != 0:
                verdict, detail = "killed (does not build)", ""
            else:
                code = run(["ctest", "--test-dir", build, f"-j{args.jobs}", "--stop-on-failure",
                            "--timeout", "600"] + label, source, log, timeout=3600)
                verdict = "killed" if code != 0 else "SURVIVED"
                detail = first_failure(log) if code != 0 else ""
        finally:
            with open(target, "w") as out:
                out.write(original)
            os.utime(target)  # newer than the mutant's objects, so the next build redoes them
        rows.append((mutant_id, what, verdict, detail))
        print(f"mutation check: {mutant_id:30} {verdict} in {time.time() - start:.0f} s {detail}",
              flush=True)
    run(["ninja", "-C", build, f"-j{args.jobs}"], source, os.path.join(logs, "restore.log"))

    ran = [r for r in rows if not r[2].startswith("not run")]
    killed = sum(1 for r in ran if r[2].startswith("killed"))
    table = ["| mutant | the bug | verdict | first failing test |", "|---|---|---|---|"]
    table += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in rows]
    summary = f"{killed} of {len(ran)} mutants killed, {len(ran) - killed} survived"
    text = "\n".join(table) + f"\n\n{summary}\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(text)
    return 0 if killed == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
