// Careless and hostile clients, over fetch and raw sockets: every bad request gets one OpenAI
// error body with the right status, and after a thousand mixed requests from 32 concurrent
// clients (some hanging up mid-stream) the server is healthy, idle and holds no KV pages.
import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";

import {
  authorization,
  baseUrl,
  contextLength,
  get,
  modelId,
  parseEvents,
  parseMetrics,
  post,
} from "./server_under_test.mjs";

const { hostname, port } = new URL(baseUrl);

function assertError(response, status, { type, param, message } = {}) {
  assert.equal(response.status, status, `expected ${status}, got ${response.status}: ${response.text}`);
  assert.ok(response.json?.error, `no OpenAI error body: ${response.text}`);
  const { error } = response.json;
  assert.equal(typeof error.message, "string");
  if (type) assert.equal(error.type, type);
  if (param !== undefined) assert.equal(error.param, param);
  if (message) assert.match(error.message, message);
}

// Sends raw bytes and returns everything the server answers until it closes the connection.
function rawExchange(bytes, { timeoutMs = 10_000 } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname);
    const chunks = [];
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(Buffer.concat(chunks).toString("latin1"));
    }, timeoutMs);
    socket.on("connect", () => socket.write(bytes));
    socket.on("data", (chunk) => chunks.push(chunk));
    socket.on("error", (error) => {
      clearTimeout(timer);
      // A reset after the answer arrived still counts as the answer.
      if (chunks.length) resolve(Buffer.concat(chunks).toString("latin1"));
      else reject(error);
    });
    socket.on("end", () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString("latin1"));
    });
  });
}

function statusOf(rawResponse) {
  const match = /^HTTP\/1\.1 (\d{3})/.exec(rawResponse);
  return match ? Number(match[1]) : 0;
}

function rawBody(rawResponse) {
  return rawResponse.slice(rawResponse.indexOf("\r\n\r\n") + 4);
}

const completion = (extra = {}) => ({ prompt: "Once upon a time", max_tokens: 2, temperature: 0, ...extra });
const chat = (extra = {}) => ({
  messages: [{ role: "user", content: "Hello" }],
  max_tokens: 2,
  temperature: 0,
  ...extra,
});

test("malformed JSON, wrong types and unknown fields are 400s naming the problem", async () => {
  assertError(await post("/v1/completions", '{"prompt": '), 400, {
    type: "invalid_request_error",
    message: /not valid JSON/,
  });
  assertError(await post("/v1/completions", ""), 400, { message: /empty/ });
  assertError(await post("/v1/completions", "[]"), 400, { message: /JSON object/ });
  assertError(await post("/v1/completions", { prompt: 5 }), 400, { param: "prompt", message: /a string/ });
  assertError(await post("/v1/completions", completion({ max_tokens: "ten" })), 400, {
    param: "max_tokens",
    message: /an integer/,
  });
  assertError(await post("/v1/chat/completions", { messages: "hi" }), 400, { param: "messages" });
  assertError(await post("/v1/chat/completions", chat({ messages: [{ role: "wizard", content: "x" }] })), 400, {
    param: "messages[0].role",
  });
  assertError(await post("/v1/completions", completion({ sneaky: true })), 400, {
    param: "sneaky",
    message: /unrecognized/,
  });
  assertError(await post("/v1/completions", completion({ logprobs: 21 })), 400, {
    param: "logprobs",
    message: /from 0 to 20/,
  });
  assertError(await post("/v1/completions", completion({ n: 2 })), 400, { param: "n" });
  assertError(await post("/v1/completions", '{"prompt": "a", "prompt": "b"}'), 400, { message: /twice/ });
  assertError(await post("/v1/completions", "[".repeat(100_000)), 400, { message: /nests deeper/ });
  assertError(await post("/v1/completions", completion({ attention: { window: 1e9 } })), 400, {
    param: "attention.window",
  });
  // Fields OpenAI clients send that change nothing here are accepted.
  const accepted = await post("/v1/completions", completion({ user: "someone", presence_penalty: 0 }));
  assert.equal(accepted.status, 200, accepted.text);
});

test("tokenize and detokenize refuse what is not one input or not token ids", async () => {
  assertError(await post("/tokenize", {}), 400, { param: "prompt", message: /either 'prompt' or 'messages'/ });
  assertError(await post("/tokenize", { prompt: "a", messages: [{ role: "user", content: "b" }] }), 400, {
    param: "messages",
  });
  assertError(await post("/tokenize", { prompt: 7 }), 400, { param: "prompt" });
  assertError(await post("/tokenize", { prompt: "a", model: "other" }), 404, { param: "model" });
  assertError(await post("/tokenize", { prompt: "a", extra: 1 }), 400, { param: "extra", message: /unrecognized/ });
  assertError(await post("/tokenize", "[1"), 400, { message: /not valid JSON/ });
  assertError(await post("/detokenize", {}), 400, { param: "tokens" });
  assertError(await post("/detokenize", { tokens: [1, -1] }), 400, { param: "tokens[1]" });
  assertError(await post("/detokenize", { tokens: [1e12] }), 400, { param: "tokens[0]" });
  assertError(await post("/detokenize", { tokens: "1 2" }), 400, { param: "tokens" });
  const wrongMethod = await get("/tokenize");
  assertError(wrongMethod, 405, { message: /POST/ });
});

test("invalid UTF-8, an unknown model and a body over the limit are refused", async () => {
  const invalid = Buffer.concat([Buffer.from('{"prompt": "caf'), Buffer.from([0xc3, 0x28]), Buffer.from('"}')]);
  assertError(await post("/v1/completions", invalid), 400, { message: /UTF-8/ });
  assertError(await post("/v1/completions", completion({ model: "gpt-4o" })), 404, {
    type: "not_found_error",
    param: "model",
    message: /gpt-4o/,
  });
  assertError(await get("/v1/models/gpt-4o"), 404, { type: "not_found_error" });
  const huge = JSON.stringify({ prompt: "a".repeat(9 << 20) });
  assertError(await post("/v1/completions", huge), 413, { message: /limit/ });
});

test("a prompt past the context is a 400 naming both numbers", async () => {
  const long = "lorem ipsum ".repeat(contextLength);
  const context = new RegExp(`the prompt has (\\d+) tokens and the context holds ${contextLength}`);
  const refused = await post("/v1/completions", completion({ prompt: long }));
  assertError(refused, 400, { param: "prompt", message: context });
  assert.ok(Number(context.exec(refused.json.error.message)[1]) > contextLength);
  assertError(await post("/v1/chat/completions", chat({ messages: [{ role: "user", content: long }] })), 400, {
    param: "messages",
    message: context,
  });
  assertError(await post("/v1/completions", completion({ max_tokens: contextLength })), 400, {
    param: "max_tokens",
    message: new RegExp(`${contextLength}`),
  });
});

test("without the right key only /health and the page answer", async () => {
  const noKey = {};
  const wrongKey = { Authorization: "Bearer nope" };
  for (const headers of [noKey, wrongKey, { Authorization: "Basic abc" }]) {
    assertError(await post("/v1/completions", completion(), { headers }), 401, { type: "authentication_error" });
    assertError(await post("/v1/chat/completions", chat(), { headers }), 401, { type: "authentication_error" });
    assertError(await post("/v1/completions", "{not json", { headers }), 401, { type: "authentication_error" });
    assertError(await get("/v1/models", { headers }), 401, { type: "authentication_error" });
    assertError(await get("/metrics", { headers }), 401, { type: "authentication_error" });
    assertError(await post("/tokenize", { prompt: "x" }, { headers }), 401, { type: "authentication_error" });
    assertError(await post("/detokenize", { tokens: [1] }, { headers }), 401, { type: "authentication_error" });
    assertError(await get("/nowhere", { headers }), 401, { type: "authentication_error" });
  }
  assert.equal((await get("/health", { headers: noKey })).status, 200);
  assert.equal((await get("/", { headers: noKey })).status, 200);
});

test("unknown routes are 404, wrong methods 405, broken HTTP 4xx, all with error bodies", async () => {
  assertError(await get("/v1/engines"), 404, { type: "not_found_error", message: /\/v1\/engines/ });
  const wrongMethod = await get("/v1/completions");
  assertError(wrongMethod, 405, { message: /POST/ });
  assert.equal(wrongMethod.headers.get("allow"), "POST");
  assertError(await post("/metrics", {}), 405);

  const key = authorization.Authorization;
  const garbage = await rawExchange("NONSENSE\r\n\r\n");
  assert.equal(statusOf(garbage), 400, garbage);
  assert.ok(JSON.parse(rawBody(garbage)).error);

  const chunked = await rawExchange(
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: ${key}\r\nTransfer-Encoding: chunked\r\n` +
      "Connection: close\r\n\r\n5\r\n{\"a\":\r\n0\r\n\r\n",
  );
  assert.equal(statusOf(chunked), 411, chunked);
  const gzip = await rawExchange(
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: ${key}\r\nContent-Encoding: gzip\r\n` +
      "Content-Length: 4\r\nConnection: close\r\n\r\nabcd",
  );
  assert.equal(statusOf(gzip), 415, gzip);
  const lengthless = await rawExchange(
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: ${key}\r\nConnection: close\r\n\r\n{}`,
  );
  assert.equal(statusOf(lengthless), 411, lengthless);
  // A body shorter than its Content-Length: the server waits, then gives up on the request.
  const short = await rawExchange(
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: ${key}\r\nContent-Length: 100\r\n` +
      'Connection: close\r\n\r\n{"prompt":',
    { timeoutMs: 15_000 },
  );
  assert.ok(short === "" || statusOf(short) === 400, short);
});

// One request of a kind picked by `index`; resolves to a problem description or null.
async function mixedRequest(index) {
  const signal = AbortSignal.timeout(120_000);
  const kinds = [
    async () => {
      const response = await post("/v1/completions", completion({ max_tokens: 1 + (index % 4) }), { signal });
      if (response.status !== 200) return `completion: ${response.status} ${response.text}`;
      const { usage } = response.json;
      return usage.total_tokens === usage.prompt_tokens + usage.completion_tokens ? null : "usage";
    },
    async () => {
      const response = await post("/v1/chat/completions", chat({ temperature: 0.9, seed: index }), { signal });
      return response.status === 200 ? null : `chat: ${response.status} ${response.text}`;
    },
    async () => {
      const response = await post("/v1/completions", completion({ stream: true, max_tokens: 3 }), { signal });
      const events = parseEvents(response.text);
      if (response.status !== 200 || events.at(-1) !== "[DONE]") return `stream: ${response.text}`;
      return null;
    },
    async () => {
      // Hangs up after the first bytes of a long answer.
      const controller = new AbortController();
      const response = await fetch(`${baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authorization },
        body: JSON.stringify(chat({ stream: true, max_tokens: 200, temperature: 1, seed: index })),
        signal: controller.signal,
      });
      if (response.status !== 200) return `aborted stream: ${response.status}`;
      await response.body.getReader().read();
      controller.abort();
      return null;
    },
    async () => {
      // The same over a raw socket, closed mid-stream.
      const body = JSON.stringify(completion({ stream: true, max_tokens: 200, temperature: 1, seed: index }));
      await new Promise((resolve) => {
        const socket = net.connect(Number(port), hostname, () => {
          socket.write(
            `POST /v1/completions HTTP/1.1\r\nHost: x\r\n${"Authorization: " + authorization.Authorization}\r\n` +
              `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
          );
        });
        socket.once("data", () => {
          socket.destroy();
          resolve();
        });
        socket.on("error", resolve);
        socket.on("close", resolve);
      });
      return null;
    },
    async () => {
      const response = await post("/v1/completions", '{"prompt": "x", ', { signal });
      return response.status === 400 && response.json?.error ? null : `bad json: ${response.status}`;
    },
    async () => {
      const response = await post("/v1/chat/completions", chat({ temperature: "warm" }), { signal });
      return response.status === 400 && response.json?.error?.param === "temperature" ? null : `bad type: ${response.text}`;
    },
    async () => {
      const response = await post("/v1/completions", completion(), { headers: { Authorization: "Bearer x" }, signal });
      return response.status === 401 ? null : `bad key: ${response.status}`;
    },
    async () => {
      const response = await get(`/v1/unknown/${index}`);
      return response.status === 404 && response.json?.error ? null : `route: ${response.status}`;
    },
    async () => {
      const response = await post("/v1/completions", completion({ model: `model-${index}` }), { signal });
      return response.status === 404 ? null : `model: ${response.status}`;
    },
    async () => {
      const body = Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xc0, 0x80]), Buffer.from('"}')]);
      const response = await post("/v1/completions", body, { signal });
      return response.status === 400 ? null : `utf8: ${response.status}`;
    },
    async () => {
      const response = await post("/v1/completions", completion({ attention: { prefill: "entropy", decode: "snapkv" } }), { signal });
      return response.status === 200 && response.json.entropyinfer.methods === "entropy+snapkv" ? null : `attention: ${response.text}`;
    },
  ];
  try {
    return await kinds[index % kinds.length]();
  } catch (error) {
    return `request ${index} (kind ${index % kinds.length}) threw: ${error.message}`;
  }
}

const mixedTotal = Number(process.env.ENTROPYINFER_HOSTILE_REQUESTS ?? "1000");

test(`${mixedTotal} mixed requests from 32 clients leave the server healthy, idle and with no pages held`, async () => {
  const total = mixedTotal;
  const clients = 32;
  let next = 0;
  const problems = [];
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (next < total) {
        const problem = await mixedRequest(next++);
        if (problem) problems.push(problem);
      }
    }),
  );
  assert.deepEqual(problems.slice(0, 10), [], `${problems.length} of ${total} went wrong`);

  // Cancelled sequences are dropped at the scheduler's next step; give it a moment.
  let metrics;
  for (let attempt = 0; attempt < 100; attempt++) {
    metrics = parseMetrics((await get("/metrics")).text);
    if (
      metrics.get("entropyinfer_kv_pool_pages_used") === 0 &&
      metrics.get("entropyinfer_running_sequences") === 0 &&
      metrics.get("entropyinfer_queue_length") === 0
    ) {
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.equal(metrics.get("entropyinfer_kv_pool_pages_used"), 0);
  assert.equal(metrics.get("entropyinfer_running_sequences"), 0);
  assert.equal(metrics.get("entropyinfer_queue_length"), 0);
  assert.ok(metrics.get("entropyinfer_kv_pool_pages_total") > 0);
  assert.ok(metrics.get('entropyinfer_http_requests_total{endpoint="/v1/completions",status="200"}') > 0);
  assert.ok(metrics.get('entropyinfer_http_requests_total{endpoint="other",status="404"}') > 0);
  const health = await get("/health", { headers: {} });
  assert.equal(health.status, 200);
  assert.deepEqual(health.json, { status: "ok" });
  // And it still answers properly.
  const after = await post("/v1/completions", completion({ model: modelId }));
  assert.equal(after.status, 200, after.text);
});
