// The chat page in headless chromium (the system's, through puppeteer-core): type a question,
// send it, and wait for the streamed answer and its stats.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import puppeteer from "puppeteer-core";

import { apiKey, baseUrl } from "./server_under_test.mjs";

// The binary itself rather than Debian's /usr/bin/chromium wrapper script.
const executablePath = process.env.CHROMIUM_PATH ?? "/usr/lib/chromium/chromium";

let browser;

before(async () => {
  browser = await puppeteer.launch({
    executablePath,
    headless: true,
    // Root in a container has no user namespace for chromium's sandbox.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
  });
});

after(async () => {
  await browser?.close();
});

async function openPage() {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console: ${message.text()}`);
  });
  // Anything the page loads from elsewhere would be a failure of "no external resources".
  page.on("request", (request) => {
    const url = request.url();
    if (!url.startsWith(baseUrl) && !url.startsWith("data:")) problems.push(`external request: ${url}`);
  });
  const response = await page.goto(`${baseUrl}/`, { waitUntil: "load" });
  assert.equal(response.status(), 200);
  assert.match(response.headers()["content-type"], /text\/html/);
  return { page, problems };
}

async function ask(page, question) {
  await page.type("#prompt", question);
  await page.keyboard.press("Enter");
  const count = await page.$$eval(".assistant", (elements) => elements.length);
  await page.waitForFunction(
    (expected) => document.querySelectorAll('.assistant[data-done="1"]').length >= expected,
    { timeout: 60_000 },
    count,
  );
  return page.$$eval(".assistant", (elements) => {
    const last = elements.at(-1);
    return {
      text: last.querySelector(".text").textContent,
      stats: last.querySelector(".stats").textContent,
      error: last.classList.contains("error"),
      method: last.dataset.method,
      ttft: Number(last.dataset.ttft),
    };
  });
}

test("the chat page streams an answer and shows its method, first-token time and speed", async () => {
  const { page, problems } = await openPage();
  await page.type("#api-key", apiKey);
  await page.$eval("#api-key", (input) => input.dispatchEvent(new Event("change")));
  await page.select("#method", "entropy+latent");
  await page.$eval("#max-tokens", (input) => {
    input.value = "12";
  });
  const answer = await ask(page, "What is the secret of cut? It is");
  assert.equal(answer.error, false, `the page reported: ${answer.text}`);
  assert.ok(answer.text.length > 0, "the assistant message is empty");
  assert.equal(answer.method, "entropy+latent");
  assert.match(answer.stats, /entropy\+latent/);
  assert.match(answer.stats, /first token \d+ ms/);
  assert.match(answer.stats, /[\d.]+ tokens\/s/);
  assert.match(answer.stats, /cache kept [\d.]+%/);
  assert.ok(answer.ttft > 0);

  // The second turn resends the conversation: the user's two messages are on the page.
  const second = await ask(page, "And then?");
  assert.equal(second.error, false, `the page reported: ${second.text}`);
  assert.equal(await page.$$eval(".user", (elements) => elements.length), 2);
  assert.deepEqual(problems, []);
  await page.close();
});

test("the chat page shows the server's refusal when the key is wrong", async () => {
  const { page } = await openPage();
  await page.$eval("#api-key", (input) => {
    input.value = "not-the-key";
  });
  const answer = await ask(page, "Hello?");
  assert.equal(answer.error, true);
  assert.match(answer.text, /API key/);
  await page.close();
});
