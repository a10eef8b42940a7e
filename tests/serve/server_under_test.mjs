// Where the server under test is and how to reach it, from the environment scripts/test_serve.sh
// sets: ENTROPYINFER_URL (http://host:port), ENTROPYINFER_API_KEY, ENTROPYINFER_MODEL (the served
// model id), ENTROPYINFER_CONTEXT (its context length in tokens) and ENTROPYINFER_MODEL_DIR (its
// folder, for token ids).
import { readFileSync } from "node:fs";
import path from "node:path";

export const baseUrl = process.env.ENTROPYINFER_URL;
export const apiKey = process.env.ENTROPYINFER_API_KEY;
export const modelId = process.env.ENTROPYINFER_MODEL ?? "needle-llama-11m";
export const contextLength = Number(process.env.ENTROPYINFER_CONTEXT ?? "2048");
export const modelDir = process.env.ENTROPYINFER_MODEL_DIR;

if (!baseUrl || !apiKey) {
  throw new Error("set ENTROPYINFER_URL and ENTROPYINFER_API_KEY (scripts/test_serve.sh does)");
}

// The id of a word with its leading space in the served model's byte-level BPE vocabulary, read
// from its tokenizer.json (where a leading space is written "Ġ").
export function wordTokenId(word) {
  if (!modelDir) throw new Error("set ENTROPYINFER_MODEL_DIR (scripts/test_serve.sh does)");
  const tokenizer = JSON.parse(readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
  const id = tokenizer.model.vocab[`\u0120${word}`];
  if (id === undefined) throw new Error(`" ${word}" is not one token of ${modelDir}`);
  return id;
}

// A prompt of the kind the shipped model was trained on, so that greedy answers are text.
export const needlePrompt =
  "The secret of cut is oil. The weather was fine and the road was long. " +
  "What is the secret of cut? It is";

export const authorization = { Authorization: `Bearer ${apiKey}` };

// POSTs `body` (an object, or a string / Buffer sent as is) as JSON; returns status and the
// parsed JSON body (or the text when it is not JSON).
export async function post(path, body, { headers = authorization, signal } = {}) {
  const response = await fetch(baseUrl + path, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" || Buffer.isBuffer(body) ? body : JSON.stringify(body),
    signal,
  });
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, json, text };
}

export async function get(path, { headers = authorization } = {}) {
  const response = await fetch(baseUrl + path, { headers });
  const text = await response.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, json, text };
}

// The `data:` payloads of a server-sent event stream, "[DONE]" included as the string.
export function parseEvents(text) {
  const events = [];
  for (const block of text.split("\n\n")) {
    const data = block
      .split("\n")
      .filter((line) => line.startsWith("data: "))
      .map((line) => line.slice(6))
      .join("\n");
    if (data === "") continue;
    events.push(data === "[DONE]" ? data : JSON.parse(data));
  }
  return events;
}

// Prometheus text -> Map of "name{labels}" -> value.
export function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    samples.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return samples;
}
