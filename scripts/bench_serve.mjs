#!/usr/bin/env node
// Load benchmark for `entropyinfer serve` (or any OpenAI-compatible server), printed like vLLM's
// benchmark_serving: throughput, time to first token, time per output token and inter-token
// latency (mean, median, p99), and, from the server's /metrics sampled during the run, the most
// sequences running at once and the most KV pool pages in use.
//
//   node scripts/bench_serve.mjs --url http://127.0.0.1:8080 --clients 16 --prompt-tokens 2000 \
//     --max-tokens 64 [--attention '{"prefill":"entropy","decode":"snapkv"}'] [--compare]
//
// --compare runs the same requests twice, all clients at once and then one at a time, and prints
// the ratio of output tokens/s: what continuous batching buys. Requests use /v1/completions,
// streamed, with usage; prompts are distinct (a client number leads each) so that nothing could be
// shared between them.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: {
    url: { type: "string", default: "http://127.0.0.1:8080" },
    "api-key": { type: "string", default: "" },
    clients: { type: "string", default: "8" },
    "prompt-tokens": { type: "string", default: "1000" },
    "prompt-file": { type: "string", default: "" },
    "max-tokens": { type: "string", default: "64" },
    attention: { type: "string", default: "" },
    compare: { type: "boolean", default: false },
    json: { type: "string", default: "" },
  },
});

const clients = Number(args.clients);
const maxTokens = Number(args["max-tokens"]);
const promptTokens = Number(args["prompt-tokens"]);
for (const [name, value] of [["--clients", clients], ["--max-tokens", maxTokens], ["--prompt-tokens", promptTokens]]) {
  if (!Number.isInteger(value) || value < 1) {
    console.error(`error: ${name} must be a positive integer`);
    process.exit(1);
  }
}
let attention;
if (args.attention) {
  try {
    attention = JSON.parse(args.attention);
  } catch (error) {
    console.error(`error: --attention is not JSON: ${error.message}`);
    process.exit(1);
  }
}
const headers = { "Content-Type": "application/json" };
if (args["api-key"]) headers.Authorization = `Bearer ${args["api-key"]}`;

// About promptTokens tokens of text: words of ordinary prose are a little over one token each.
function promptFor(client) {
  const source = args["prompt-file"]
    ? readFileSync(args["prompt-file"], "utf8")
    : "The lighthouse keeper counted the ships that passed before dawn and wrote each one down. ";
  const words = [];
  const pool = source.split(/\s+/).filter(Boolean);
  const wanted = Math.round(promptTokens * 0.75);
  for (let i = 0; words.length < wanted; ++i) words.push(pool[i % pool.length]);
  return `Client ${client}. ${words.join(" ")}`;
}

async function metrics() {
  try {
    const response = await fetch(`${args.url}/metrics`, { headers });
    const text = await response.text();
    const read = (name) => {
      const line = text.split("\n").find((l) => l.startsWith(name + " ") || l.startsWith(name + "{"));
      return line ? Number(line.trim().split(/\s+/).pop()) : NaN;
    };
    return {
      running: read("entropyinfer_running_sequences"),
      pagesUsed: read("entropyinfer_kv_pool_pages_used"),
      pagesTotal: read("entropyinfer_kv_pool_pages_total"),
    };
  } catch {
    return { running: NaN, pagesUsed: NaN, pagesTotal: NaN };
  }
}

async function oneRequest(client) {
  const body = {
    prompt: promptFor(client),
    max_tokens: maxTokens,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (attention) body.attention = attention;
  const start = performance.now();
  const response = await fetch(`${args.url}/v1/completions`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  const arrivals = [];
  let usage = null;
  let buffered = "";
  const decoder = new TextDecoder();
  for await (const bytes of response.body) {
    buffered += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices?.length && chunk.choices[0].text) arrivals.push(performance.now());
    }
  }
  const finish = performance.now();
  return { start, arrivals, finish, usage };
}

function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank];
}
function summary(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mean = sorted.reduce((a, b) => a + b, 0) / Math.max(sorted.length, 1);
  return { mean, median: percentile(sorted, 50), p99: percentile(sorted, 99) };
}

async function run(together) {
  let peakRunning = 0;
  let peakPages = 0;
  let pagesTotal = NaN;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const m = await metrics();
      if (m.running > peakRunning) peakRunning = m.running;
      if (m.pagesUsed > peakPages) peakPages = m.pagesUsed;
      pagesTotal = m.pagesTotal;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  })();
  const begin = performance.now();
  let results = [];
  if (together) {
    results = await Promise.all(Array.from({ length: clients }, (_, i) => oneRequest(i)));
  } else {
    for (let i = 0; i < clients; ++i) results.push(await oneRequest(i));
  }
  const duration = (performance.now() - begin) / 1000;
  sampling = false;
  await sampler;
  const ttft = [];
  const tpot = [];
  const itl = [];
  let input = 0;
  let output = 0;
  for (const r of results) {
    if (!r.usage) throw new Error("a response carried no usage");
    input += r.usage.prompt_tokens;
    output += r.usage.completion_tokens;
    if (r.arrivals.length) ttft.push(r.arrivals[0] - r.start);
    if (r.usage.completion_tokens > 1 && r.arrivals.length)
      tpot.push((r.finish - r.arrivals[0]) / (r.usage.completion_tokens - 1));
    for (let i = 1; i < r.arrivals.length; ++i) itl.push(r.arrivals[i] - r.arrivals[i - 1]);
  }
  return {
    mode: together ? "all clients at once" : "one at a time",
    requests: results.length,
    duration,
    input,
    output,
    requestThroughput: results.length / duration,
    outputThroughput: output / duration,
    totalThroughput: (input + output) / duration,
    ttft: summary(ttft),
    tpot: summary(tpot),
    itl: summary(itl),
    peakRunning,
    peakPages,
    pagesTotal,
  };
}

function print(r) {
  const row = (label, value) => console.log(label.padEnd(40) + String(value).padStart(12));
  const ms = (x) => x.toFixed(2);
  console.log(`============ Serving Benchmark Result (${r.mode}) ============`);
  row("Successful requests:", r.requests);
  row("Benchmark duration (s):", r.duration.toFixed(2));
  row("Total input tokens:", r.input);
  row("Total generated tokens:", r.output);
  row("Request throughput (req/s):", r.requestThroughput.toFixed(2));
  row("Output token throughput (tok/s):", r.outputThroughput.toFixed(2));
  row("Total Token throughput (tok/s):", r.totalThroughput.toFixed(2));
  row("Peak concurrent sequences:", r.peakRunning);
  row("Peak KV pool pages used:", `${r.peakPages} / ${r.pagesTotal}`);
  for (const [title, s, name] of [
    ["Time to First Token", r.ttft, "TTFT"],
    ["Time per Output Token (excl. 1st token)", r.tpot, "TPOT"],
    ["Inter-token Latency", r.itl, "ITL"],
  ]) {
    console.log(`${"-".repeat(8)}${title}${"-".repeat(Math.max(0, 46 - title.length))}`);
    row(`Mean ${name} (ms):`, ms(s.mean));
    row(`Median ${name} (ms):`, ms(s.median));
    row(`P99 ${name} (ms):`, ms(s.p99));
  }
  console.log("=".repeat(62));
}

const report = {
  url: args.url,
  clients,
  promptTokens,
  maxTokens,
  attention: attention ?? null,
  runs: [],
};
try {
  const together = await run(true);
  print(together);
  report.runs.push(together);
  if (args.compare) {
    const alone = await run(false);
    print(alone);
    report.runs.push(alone);
    const ratio = together.outputThroughput / alone.outputThroughput;
    console.log(
      `continuous batching: ${together.outputThroughput.toFixed(1)} output tokens/s with ${clients} ` +
        `clients at once against ${alone.outputThroughput.toFixed(1)} one at a time: ${ratio.toFixed(2)}x`,
    );
    report.batchingSpeedup = ratio;
  }
} catch (error) {
  console.error(`error: ${error.message}`);
  process.exit(1);
}
if (args.json) {
  const { writeFileSync } = await import("node:fs");
  writeFileSync(args.json, JSON.stringify(report, null, 2));
}
