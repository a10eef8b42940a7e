#!/usr/bin/env python3
"""A step model of the server's long-prompt scenario: how long 16 clients, each a long prompt and
256 output tokens arriving together, take under the scheduler's rules (one prefill at a time in
slices, continuous batching of the answers, small decode batches sitting out prefill steps).

Costs come from measurements, not from this model: the prefill's seconds per token-layer (a whole
prompt's prefill time over its tokens x layers) and a decode step's weight read and per-sequence
cache read. It predicts the ratio of full attention's wall time to a sparse method's, and the
answers' inter-token latency, for several `--decode-wait-steps` settings.

Defaults: the H200 of bench/results/gpu-2026-11-30-methods.md (130,816-token prefill 10.29 s full,
3.41 s EntropyInfer; decode 4.0 ms of weights, a full 128k cache 3.8 ms more per sequence). The
server slices prefill work by cost (attention counted by keys read), so full attention's prompt is
modelled as 3x the sparse one's work at the same cost per unit.

    python3 bench/serve_step_model.py [--waits 0,1,2,3,4,6] [--wait-batch 4]
"""
import argparse


def run_scenario(unit_seconds, prompt_units, weight_seconds, cache_seconds, wait_batch, wait_steps,
                 clients, output_tokens, budget_decoding, budget_alone):
    """Wall seconds, mean and p99 inter-token seconds of one wave."""
    now = 0.0
    queued = clients
    prefill_left = 0.0
    prefilling = False
    answers = []  # [tokens left, time of the last token, steps sat out]
    gaps = []
    while queued or prefilling or answers:
        if not prefilling and queued:
            queued -= 1
            prefilling = True
            prefill_left = prompt_units
        decode = bool(answers) and (not prefilling or len(answers) >= wait_batch
                                    or max(a[2] for a in answers) >= wait_steps)
        step = 0.0
        if prefilling:
            work = min(prefill_left, budget_decoding if answers else budget_alone)
            step += work * unit_seconds
            prefill_left -= work
        if decode:
            step += weight_seconds + cache_seconds * len(answers)
        else:
            for a in answers:
                a[2] += 1
        now += step
        if decode:
            for a in answers:
                gaps.append(now - a[1])
                a[0] -= 1
                a[1] = now
                a[2] = 0
            answers = [a for a in answers if a[0] > 0]
        if prefilling and prefill_left <= 0:
            prefilling = False
            answers.append([output_tokens - 1, now, 0])  # the first token comes with the prefill
    gaps.sort()
    return now, sum(gaps) / len(gaps), gaps[int(len(gaps) * 0.99)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=130816)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--sparse-prefill-s", type=float, default=3.41)
    parser.add_argument("--full-work-factor", type=float, default=3.0,
                        help="full attention's prefill work over the sparse one's")
    parser.add_argument("--weight-ms", type=float, default=4.0)
    parser.add_argument("--sparse-cache-ms", type=float, default=0.05)
    parser.add_argument("--full-cache-ms", type=float, default=3.8)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--budget-decoding", type=float, default=8192)
    parser.add_argument("--budget", type=float, default=65536)
    parser.add_argument("--wait-batch", type=int, default=4)
    parser.add_argument("--waits", default="0,1,2,3,4,6")
    args = parser.parse_args()

    units = float(args.prompt * args.layers)
    unit_seconds = args.sparse_prefill_s / units
    print("| decode wait steps | sparse wall s | full wall s | full / sparse "
          "| sparse ITL mean / p99 ms | full ITL mean / p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for wait in (int(w) for w in args.waits.split(",")):
        common = dict(wait_batch=args.wait_batch, wait_steps=wait, clients=args.clients,
                      output_tokens=args.output, budget_decoding=args.budget_decoding,
                      budget_alone=args.budget)
        sparse = run_scenario(unit_seconds, units, args.weight_ms / 1e3, args.sparse_cache_ms / 1e3,
                              **common)
        full = run_scenario(unit_seconds, units * args.full_work_factor, args.weight_ms / 1e3,
                            args.full_cache_ms / 1e3, **common)
        print(f"| {wait} | {sparse[0]:.1f} | {full[0]:.1f} | {full[0] / sparse[0]:.2f} "
              f"| {sparse[1] * 1e3:.1f} / {sparse[2] * 1e3:.1f} "
              f"| {full[1] * 1e3:.1f} / {full[2] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
