// `entropyinfer serve` through the official openai package: completions and chat completions,
// whole and streamed, usage that agrees with the stream, the `attention` extra field, and the
// SDK's own error classes for refusals.
import assert from "node:assert/strict";
import { test } from "node:test";

import OpenAI from "openai";

import { apiKey, baseUrl, contextLength, modelId, needlePrompt, post, wordTokenId } from "./server_under_test.mjs";

const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });

function assertUsage(usage, maxTokens) {
  assert.ok(usage.prompt_tokens > 0, "prompt_tokens");
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= maxTokens, "completion_tokens");
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

function assertFinish(finishReason, usage, maxTokens) {
  // "length" exactly when the answer used every token it was allowed.
  assert.equal(finishReason, usage.completion_tokens === maxTokens ? "length" : "stop");
}

test("the model list names the served model", async () => {
  const models = await client.models.list();
  assert.deepEqual(
    models.data.map((model) => model.id),
    [modelId],
  );
  const model = await client.models.retrieve(modelId);
  assert.equal(model.object, "model");
});

test("a completion answers the needle question", async () => {
  const completion = await client.completions.create({
    model: modelId,
    prompt: needlePrompt,
    max_tokens: 6,
    temperature: 0,
  });
  assert.equal(completion.object, "text_completion");
  assert.match(completion.id, /^cmpl-/);
  assert.equal(completion.model, modelId);
  assert.equal(completion.choices.length, 1);
  const [choice] = completion.choices;
  assert.ok(choice.text.length > 0, "empty completion");
  assert.ok(choice.text.startsWith(" oil"), `the trained answer is " oil", got ${JSON.stringify(choice.text)}`);
  assertUsage(completion.usage, 6);
  assertFinish(choice.finish_reason, completion.usage, 6);
  assert.equal(completion.entropyinfer.methods, "full+full");
});

test("a streamed completion gives the same greedy text and usage that matches its events", async () => {
  const request = { model: modelId, prompt: "Once upon a time", max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(request);
  const stream = await client.completions.create({
    ...request,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let textEvents = 0;
  let finishReason = null;
  let usage = null;
  let ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.text) {
        text += choice.text;
        textEvents += 1;
      }
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  assert.equal(ids.size, 1, "every chunk carries the same id");
  assert.equal(text, whole.choices[0].text);
  assert.ok(usage, "no usage chunk with include_usage");
  assert.deepEqual(usage, whole.usage);
  // A text event holds one token or more (a character split across tokens waits for its end).
  assert.ok(textEvents >= 1 && textEvents <= usage.completion_tokens);
  assertFinish(finishReason, usage, 12);
});

test("a chat completion answers as the assistant", async () => {
  const completion = await client.chat.completions.create({
    model: modelId,
    messages: [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: needlePrompt },
    ],
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(completion.object, "chat.completion");
  assert.match(completion.id, /^chatcmpl-/);
  const [choice] = completion.choices;
  assert.equal(choice.message.role, "assistant");
  assert.equal(typeof choice.message.content, "string");
  assert.ok(completion.usage.completion_tokens > 0);
  assert.ok(completion.usage.completion_tokens <= 8);
  assert.equal(
    completion.usage.total_tokens,
    completion.usage.prompt_tokens + completion.usage.completion_tokens,
  );
  assertFinish(choice.finish_reason, completion.usage, 8);
});

test("a streamed chat sends the role first, then content, then the finish and usage", async () => {
  const stream = await client.chat.completions.create({
    model: modelId,
    messages: [{ role: "user", content: "Tell me a story." }],
    max_tokens: 10,
    temperature: 0.8,
    seed: 7,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  const finishChunk = chunks.find((chunk) => chunk.choices[0]?.finish_reason);
  assert.ok(finishChunk, "no chunk with a finish_reason");
  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, []);
  const content = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? "").join("");
  assert.ok(usageChunk.usage.completion_tokens > 0);
  assertFinish(finishChunk.choices[0].finish_reason, usageChunk.usage, 10);
  assert.equal(typeof content, "string");
  // The finish chunk carries the engine's stats, which the chat page shows.
  assert.ok(finishChunk.entropyinfer.time_to_first_token > 0);
  assert.ok(finishChunk.entropyinfer.tokens_per_second >= 0);

  // The same seed gives the same sample.
  const again = await client.chat.completions.create({
    model: modelId,
    messages: [{ role: "user", content: "Tell me a story." }],
    max_tokens: 10,
    temperature: 0.8,
    seed: 7,
  });
  assert.equal(again.choices[0].message.content, content);
});

test("the attention extra field picks the methods and the stats report them", async () => {
  const longPrompt = "The road went on and on through the quiet hills. ".repeat(40) + needlePrompt;
  const completion = await client.completions.create({
    model: modelId,
    prompt: longPrompt,
    max_tokens: 4,
    temperature: 0,
    attention: {
      prefill: "entropy",
      decode: "latent",
      segment_size: 64,
      block_size: 8,
      sparse_threshold: 128,
      base_budget: 64,
      critiprefill_budget: 64,
      budget: 128,
      window: 16,
      gap: 2,
    },
  });
  const stats = completion.entropyinfer;
  assert.equal(stats.methods, "entropy+latent");
  assert.ok(stats.prefill_keys_read > 0);
  assert.ok(stats.prefill_keys_fraction > 0 && stats.prefill_keys_fraction < 1,
            `a sparse prefill reads less than full attention: ${stats.prefill_keys_fraction}`);
  assert.ok(stats.cache_kept_fraction > 0 && stats.cache_kept_fraction <= 1);

  const streamed = await client.chat.completions.create({
    model: modelId,
    messages: [{ role: "user", content: "Hello" }],
    max_tokens: 3,
    temperature: 0,
    stream: true,
    attention: "critiprefill+snapkv",
  });
  let methods = null;
  for await (const chunk of streamed) if (chunk.entropyinfer) methods = chunk.entropyinfer.methods;
  assert.equal(methods, "critiprefill+snapkv");
});

test("logit_bias and the penalties change greedy answers as OpenAI defines them", async () => {
  const request = { model: modelId, prompt: needlePrompt, max_tokens: 4, temperature: 0 };
  const plain = await client.completions.create(request);
  assert.ok(plain.choices[0].text.startsWith(" oil"), JSON.stringify(plain.choices[0].text));
  const banned = await client.completions.create({ ...request, logit_bias: { [wordTokenId("oil")]: -100 } });
  assert.ok(!banned.choices[0].text.startsWith(" oil"), `-100 on " oil": ${JSON.stringify(banned.choices[0].text)}`);

  // +100 on " house" makes it every greedy token; the presence penalty (2, once per token
  // picked) leaves it so, the frequency penalty (2 per time picked) wears the bias down.
  const house = { ...request, max_tokens: 80, logit_bias: { [wordTokenId("house")]: 100 } };
  const houses = " house".repeat(80);
  const forced = await client.completions.create(house);
  assert.equal(forced.choices[0].text, houses);
  const present = await client.chat.completions.create({
    model: modelId,
    messages: [{ role: "user", content: "Where is it?" }],
    max_tokens: 80,
    temperature: 0,
    logit_bias: house.logit_bias,
    presence_penalty: 2,
  });
  assert.equal(present.choices[0].message.content.trim(), houses.trim());
  const frequent = await client.completions.create({ ...house, frequency_penalty: 2 });
  const text = frequent.choices[0].text;
  assert.ok(text.startsWith(" house house") && text !== houses, `frequency penalty 2: ${JSON.stringify(text)}`);

  await assert.rejects(
    client.completions.create({ ...request, logit_bias: { 4096: 5 } }),
    (error) => error instanceof OpenAI.BadRequestError && error.param === "logit_bias.4096",
  );
});

test("logprobs give each generated token's log-probability under the model", async () => {
  const request = { model: modelId, prompt: needlePrompt, max_tokens: 6, temperature: 0, logprobs: 3 };
  const completion = await client.completions.create(request);
  const [choice] = completion.choices;
  const { tokens, token_logprobs: logprobs, top_logprobs: tops, text_offset: offsets } = choice.logprobs;
  assert.equal(tokens.length, completion.usage.completion_tokens);
  assert.equal(tokens.join(""), choice.text);
  assert.equal(tokens[0], " oil");
  let offset = 0;
  tokens.forEach((token, i) => {
    assert.equal(offsets[i], offset);
    offset += Buffer.byteLength(token);
    assert.ok(logprobs[i] <= 0, `logprob ${logprobs[i]}`);
    // Greedy: the chosen token is the most likely of the top three, which the map holds.
    const entries = Object.entries(tops[i]);
    assert.ok(entries.length >= 3 && entries.length <= 4);
    assert.equal(tops[i][token], logprobs[i]);
    assert.equal(Math.max(...entries.map(([, value]) => value)), logprobs[i]);
    const mass = entries.reduce((sum, [, value]) => sum + Math.exp(value), 0);
    assert.ok(mass <= 1 + 1e-4, `top mass ${mass}`);
  });

  // The logprobs are the model's own, before the bias: with " oil" banned, the first token's
  // alternatives still show " oil" above the token chosen instead.
  const banned = await client.completions.create({ ...request, logit_bias: { [wordTokenId("oil")]: -100 } });
  const first = banned.choices[0].logprobs;
  assert.notEqual(first.tokens[0], " oil");
  assert.ok(first.top_logprobs[0][" oil"] > first.token_logprobs[0], JSON.stringify(first.top_logprobs[0]));

  // Streamed chat: each content chunk carries its tokens' entries, every generated token once.
  const stream = await client.chat.completions.create({
    model: modelId,
    messages: [{ role: "user", content: "Tell me a story." }],
    max_tokens: 12,
    temperature: 0.8,
    seed: 11,
    logprobs: true,
    top_logprobs: 2,
    stream: true,
    stream_options: { include_usage: true },
  });
  const entries = [];
  let content = "";
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices[0];
    if (!delta) continue;
    content += delta.delta?.content ?? "";
    if (delta.logprobs) entries.push(...delta.logprobs.content);
  }
  assert.equal(entries.length, usage.completion_tokens);
  // The tokens spell the content, and a stop string after it when one ended the answer.
  const spelled = Buffer.concat(entries.map((entry) => Buffer.from(entry.bytes))).toString("utf8");
  assert.ok(spelled.startsWith(content), `${JSON.stringify(spelled)} vs ${JSON.stringify(content)}`);
  for (const entry of entries) {
    assert.equal(entry.top_logprobs.length, 2);
    assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob);
    assert.ok(entry.logprob <= entry.top_logprobs[0].logprob);
  }

  await assert.rejects(
    client.chat.completions.create({ model: modelId, messages: [{ role: "user", content: "Hi" }], top_logprobs: 2 }),
    (error) => error instanceof OpenAI.BadRequestError && error.param === "top_logprobs",
  );
});

test("echo puts the prompt before the answer, whole and streamed", async () => {
  const request = { model: modelId, prompt: "Once upon a time", max_tokens: 8, temperature: 0 };
  const plain = await client.completions.create(request);
  const echoed = await client.completions.create({ ...request, echo: true });
  assert.equal(echoed.choices[0].text, request.prompt + plain.choices[0].text);
  assert.deepEqual(echoed.usage, plain.usage);
  const stream = await client.completions.create({ ...request, echo: true, stream: true });
  const pieces = [];
  for await (const chunk of stream) pieces.push(chunk.choices[0]?.text ?? "");
  assert.equal(pieces[0], request.prompt);
  assert.equal(pieces.join(""), echoed.choices[0].text);
});

// Logprobs of the same tokens computed in differently shaped products (a prompt's last row alone
// or among all its rows) agree to float rounding, not bit for bit.
function assertLogprobsClose(actual, expected, what) {
  assert.equal(actual.length, expected.length, what);
  actual.forEach((value, i) => {
    assert.ok(Math.abs(value - expected[i]) < 1e-3, `${what} ${i}: ${value} vs ${expected[i]}`);
  });
}

// lm-evaluation-harness's loglikelihood through local-completions: echo, logprobs 1, temperature 0,
// reading token_logprobs[ctxlen:-1] and checking each against max(top_logprobs).
test("echo with logprobs scores the prompt tokens, then the answer's, whole and streamed", async () => {
  const prompt = needlePrompt;
  const counted = await post("/tokenize", { model: modelId, prompt });
  assert.equal(counted.status, 200, counted.text);
  const n = counted.json.count;
  const request = { model: modelId, prompt, max_tokens: 2, temperature: 0, logprobs: 1 };
  const plain = await client.completions.create(request);
  const scored = await client.completions.create({ ...request, echo: true });
  const [choice] = scored.choices;
  assert.equal(choice.text, prompt + plain.choices[0].text);
  const { tokens, token_logprobs: logprobs, top_logprobs: tops, text_offset: offsets } = choice.logprobs;
  assert.equal(tokens.length, n + 2);
  assert.equal(logprobs.length, n + 2);
  // Nothing precedes the first token (BOS, not in the echoed text): null, and no text.
  assert.equal(logprobs[0], null);
  assert.equal(tops[0], null);
  assert.equal(tokens.slice(0, n).join(""), prompt);
  for (let i = 1; i < n; i++) {
    assert.ok(logprobs[i] <= 0 && logprobs[i] >= -9999, `prompt token ${i}: ${logprobs[i]}`);
    assert.equal(tops[i][tokens[i]], logprobs[i]);
    assert.ok(Math.max(...Object.values(tops[i])) >= logprobs[i]);
    assert.ok(offsets[i] >= offsets[i - 1]);
  }
  // The trained continuation after "It is" is likely, but not every prompt token is.
  assert.ok(Math.min(...logprobs.slice(1, n)) < Math.log(0.5), "a prompt the model finds certain");
  // The answer's part is what the request gets without echo, its offsets after the echoed text.
  assert.deepEqual(tokens.slice(n), plain.choices[0].logprobs.tokens);
  assertLogprobsClose(logprobs.slice(n), plain.choices[0].logprobs.token_logprobs, "answer token");
  assert.equal(offsets[n], Buffer.byteLength(prompt));
  assert.deepEqual(scored.usage, plain.usage);

  // The prompt extended by the answer's first token scores that token as generation did.
  const answerToken = plain.choices[0].logprobs.tokens[0];
  const extended = await client.completions.create({
    ...request,
    prompt: prompt + answerToken,
    echo: true,
    max_tokens: 0,
  });
  assert.equal(extended.choices[0].text, prompt + answerToken);
  assert.equal(extended.choices[0].finish_reason, "length");
  assert.equal(extended.usage.completion_tokens, 0);
  const extendedLogprobs = extended.choices[0].logprobs;
  assert.equal(extendedLogprobs.tokens.length, n + 1);
  assert.equal(extendedLogprobs.tokens[n], answerToken);
  assertLogprobsClose([extendedLogprobs.token_logprobs[n]], [logprobs[n]], "scored answer token");
  assert.equal(extendedLogprobs.token_logprobs[0], null);
  assertLogprobsClose(extendedLogprobs.token_logprobs.slice(1, n), logprobs.slice(1, n), "prompt token");

  // Streamed: the echoed prompt and all its scores are the first chunk.
  const stream = await client.completions.create({ ...request, echo: true, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk.choices[0]);
  assert.equal(chunks[0].text, prompt);
  assert.equal(chunks[0].logprobs.tokens.length, n);
  assert.deepEqual(chunks[0].logprobs.token_logprobs, logprobs.slice(0, n));
  const streamed = chunks.flatMap((chunk) => chunk.logprobs?.token_logprobs ?? []);
  assert.deepEqual(streamed, logprobs);
  assert.deepEqual(
    chunks.flatMap((chunk) => chunk.logprobs?.text_offset ?? []),
    offsets,
  );
  assert.equal(chunks.map((chunk) => chunk.text).join(""), choice.text);

  await assert.rejects(
    client.completions.create({ ...request, max_tokens: 0 }),
    (error) => error instanceof OpenAI.BadRequestError && error.param === "max_tokens",
  );
});

// lm-evaluation-harness's local-completions sends token ids by default (tokenized_requests), as
// vLLM takes them: used exactly as given, with no BOS added.
test("a token-id prompt answers and scores as the text it tokenizes", async () => {
  const prompt = needlePrompt;
  const counted = await post("/tokenize", { model: modelId, prompt });
  assert.equal(counted.status, 200, counted.text);
  const ids = counted.json.tokens; // BOS first, as the text prompt holds it
  const request = { model: modelId, max_tokens: 6, temperature: 0 };
  const fromText = await client.completions.create({ ...request, prompt });
  const fromIds = await client.completions.create({ ...request, prompt: ids });
  assert.ok(fromText.choices[0].text.length > 0, "empty completion");
  assert.equal(fromIds.choices[0].text, fromText.choices[0].text);
  assert.equal(fromIds.usage.prompt_tokens, ids.length);
  assert.deepEqual(fromIds.usage, fromText.usage);
  const nested = await client.completions.create({ ...request, prompt: [ids] });
  assert.equal(nested.choices[0].text, fromText.choices[0].text);
  // The ids are the prompt: none added, so without BOS there is one token fewer.
  const withoutBos = await client.completions.create({ ...request, prompt: ids.slice(1) });
  assert.equal(withoutBos.usage.prompt_tokens, ids.length - 1);

  // The loglikelihood request: echo, max_tokens 0, logprobs 1.
  const scoring = { model: modelId, echo: true, max_tokens: 0, logprobs: 1, temperature: 0 };
  const textScores = (await client.completions.create({ ...scoring, prompt })).choices[0];
  const idScored = await client.completions.create({ ...scoring, prompt: ids });
  const idScores = idScored.choices[0];
  assert.equal(idScored.usage.prompt_tokens, ids.length);
  assert.equal(idScored.usage.completion_tokens, 0);
  assert.equal(idScores.finish_reason, "length");
  const { tokens, token_logprobs: logprobs, top_logprobs: tops, text_offset: offsets } = idScores.logprobs;
  assert.equal(tokens.length, ids.length);
  assert.equal(logprobs[0], null);
  assert.equal(tops[0], null);
  assert.deepEqual(logprobs, textScores.logprobs.token_logprobs);
  assert.ok(logprobs.slice(1).every((value) => value <= 0 && value >= -9999), "scores");
  // Each token is the given id's text: BOS's included, since the client sent it.
  const decoded = await post("/detokenize", { tokens: ids });
  assert.equal(decoded.status, 200, decoded.text);
  assert.equal(idScores.text, decoded.json.prompt);
  assert.equal(tokens.join(""), decoded.json.prompt);
  assert.deepEqual(tokens.slice(1), textScores.logprobs.tokens.slice(1));
  const bos = await post("/detokenize", { tokens: [ids[0]] });
  assert.equal(tokens[0], bos.json.prompt);
  assert.ok(tokens[0].length > 0, "BOS has no text");
  const bosBytes = Buffer.byteLength(tokens[0]);
  assert.deepEqual(
    offsets.slice(1),
    textScores.logprobs.text_offset.slice(1).map((offset) => offset + bosBytes),
  );

  // Streamed: the decoded ids and all their scores are the first chunk.
  const stream = await client.completions.create({ ...scoring, prompt: ids, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk.choices[0]);
  assert.equal(chunks[0].text, decoded.json.prompt);
  assert.deepEqual(chunks[0].logprobs.token_logprobs, logprobs);
  assert.deepEqual(chunks[0].logprobs.tokens, tokens);

  // Without BOS the first given token goes unscored and the rest are scored in a shorter context.
  const bosless = (await client.completions.create({ ...scoring, prompt: ids.slice(1) })).choices[0];
  assert.equal(bosless.logprobs.token_logprobs.length, ids.length - 1);
  assert.equal(bosless.logprobs.token_logprobs[0], null);
  assert.deepEqual(bosless.logprobs.tokens, tokens.slice(1));
  assert.notDeepEqual(bosless.logprobs.token_logprobs.slice(1), logprobs.slice(2));
});

test("token-id prompts that are batches, empty or outside the vocabulary are refused", async () => {
  const refusal = (prompt, param, message) =>
    assert.rejects(client.completions.create({ model: modelId, prompt, max_tokens: 1 }), (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `got ${error.constructor.name} for ${JSON.stringify(prompt)}`);
      assert.equal(error.param, param);
      assert.match(error.message, message);
      return true;
    });
  await refusal([[1, 2], [3]], "prompt", /only one prompt per request is supported, got 2 prompts/);
  await refusal([], "prompt", /empty/);
  await refusal([[]], "prompt[0]", /empty token array/);
  // The shipped model and its tokenizer both have 4096 ids.
  await refusal([1, 4096], "prompt[1]", /token id 4096, outside the vocabulary: ids are 0 to 4095/);
  await refusal([-3], "prompt[0]", /token id -3, outside the vocabulary/);
  await refusal([1, 2.5], "prompt[1]", /must be an integer token id, got a number/);
  await refusal([1, "a"], "prompt[1]", /must be an integer token id, got a string/);
  await refusal([[[1]]], "prompt[0][0]", /got an array/);
  const tooLong = await post("/v1/completions", { prompt: new Array(contextLength).fill(wordTokenId("the")) });
  assert.equal(tooLong.status, 400, tooLong.text);
  assert.equal(tooLong.json.error.param, "prompt");
  assert.match(tooLong.json.error.message, new RegExp(`the prompt has ${contextLength} tokens`));
});

test("tokenize counts what a request holds and detokenize gives the text back", async () => {
  const prompt = "Once upon a time";
  const completion = await client.completions.create({ model: modelId, prompt, max_tokens: 1, temperature: 0 });
  const counted = await post("/tokenize", { model: modelId, prompt });
  assert.equal(counted.status, 200, counted.text);
  assert.equal(counted.json.count, completion.usage.prompt_tokens);
  assert.equal(counted.json.tokens.length, counted.json.count);
  assert.equal(counted.json.max_model_len, contextLength);
  const messages = [{ role: "user", content: prompt }];
  const chat = await client.chat.completions.create({ model: modelId, messages, max_tokens: 1, temperature: 0 });
  const chatCounted = await post("/tokenize", { messages });
  assert.equal(chatCounted.json.count, chat.usage.prompt_tokens);
  // The prompt's ids (after BOS) decode to the prompt.
  const text = await post("/detokenize", { tokens: counted.json.tokens.slice(1) });
  assert.equal(text.status, 200, text.text);
  assert.equal(text.json.prompt, prompt);
});

test("refusals raise the SDK's error classes with the field named", async () => {
  await assert.rejects(
    client.completions.create({ model: modelId, prompt: "x", temperature: 5 }),
    (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `got ${error.constructor.name}`);
      assert.equal(error.status, 400);
      assert.equal(error.param, "temperature");
      assert.equal(error.type, "invalid_request_error");
      assert.match(error.message, /temperature/);
      return true;
    },
  );
  await assert.rejects(
    client.chat.completions.create({
      model: modelId,
      messages: [{ role: "user", content: "x" }],
      attention: { decode: "lossy" },
    }),
    (error) => error instanceof OpenAI.BadRequestError && /lossy/.test(error.message),
  );
  await assert.rejects(
    client.completions.create({ model: "gpt-4o", prompt: "x" }),
    (error) => error instanceof OpenAI.NotFoundError && error.status === 404 && error.param === "model",
  );
  const stranger = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(
    stranger.completions.create({ model: modelId, prompt: "x" }),
    (error) => error instanceof OpenAI.AuthenticationError && error.status === 401,
  );
});
