#!/usr/bin/env python3
"""Times transformers' from_pretrained(DIR, dtype=bfloat16, device_map="cuda") until the weights
are on the GPU, with CUDA already initialised (so the figure is the load alone), and reports the
process's anonymous host memory (RssAnon) right after. One JSON line.

  hf_load_time.py DIR
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def rss_anon_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


torch.zeros(1, device="cuda")
torch.cuda.synchronize()
before = rss_anon_mib()
start = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="cuda")
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(json.dumps({"peer": "transformers from_pretrained(device_map='cuda')",
                  "seconds": round(seconds, 2), "rss_anon_mib_after": round(rss_anon_mib()),
                  "rss_anon_mib_before": round(before)}))
