#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (a --csv log with gpu__time_duration.sum) by kernel.

The log holds one or more profiled ranges in launch order (one decode step or one prefill per
method, with `entropyinfer bench --profile-decode-step` or `--profile-prefill`); a kernel whose
name restarts the sequence (the embedding) starts a new range, unless the kernel before it was an
embedding too (a layer-by-layer prefill embeds every chunk first). Prints per range the kernels by
total time and the sum, which next to the measured time says how much of it the kernels themselves
take.
"""
import csv
import io
import re
import sys
from collections import OrderedDict


def short_name(name: str) -> str:
    # Anonymous namespaces, as Nsight Compute writes them ("<unnamed>::") or as c++filt does, would
    # read as template or argument lists below.
    for anonymous in ("<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(anonymous, "")
    name = re.sub(r"\(.*", "", name)  # argument list
    name = re.sub(r"<.*>", "<>", name)  # template arguments
    return name.split("::")[-1].strip()


def main() -> int:
    text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        print("no kernel rows in", sys.argv[1])
        return 1
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    ranges = []
    previous = ""
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = short_name(row["Kernel Name"])
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        us = value / 1e3 if unit.startswith("n") else value if unit.startswith("u") else value * 1e3
        if not ranges or (name.startswith("embedding") and not previous.startswith("embedding")):
            ranges.append([])
        ranges[-1].append((name, us))
        previous = name
    for index, kernels in enumerate(ranges):
        totals = OrderedDict()
        for name, us in kernels:
            count, total = totals.get(name, (0, 0.0))
            totals[name] = (count + 1, total + us)
        whole = sum(us for _, us in kernels)
        print(f"range {index}: {len(kernels)} kernels, {whole:.0f} us of kernel time")
        for name, (count, total) in sorted(totals.items(), key=lambda item: -item[1][1]):
            print(f"  {name:40s} x{count:4d}  {total:8.1f} us  ({total / count:6.2f} us each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
