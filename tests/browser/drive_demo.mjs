// Drives the web demo in the system's Chromium (puppeteer-core), as a user would.
//
//   node drive_demo.mjs BASE_URL OUT_DIR
//
// Talks to the Python test over stdio, one JSON object per line: it prints
// {"ask": "stop-server"} / {"ask": "start-server"} and waits for a line on
// stdin before going on; its last line is {"result": {...}} with everything it
// measured. All audio measurements are taken inside the page, on its own
// output analyser (speechDemo.outputPeak), so they include the real Web Audio
// graph and the real WebCodecs Opus decoder.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import puppeteer from "puppeteer-core";

const [base, outDir] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const SENTENCE = "Hello! This sentence comes from the browser test, and it should be heard.";
const LONG_TEXT = "This is a long paragraph that keeps the player busy for a while. ".repeat(12);

const lines = createInterface({ input: process.stdin });
const replies = lines[Symbol.asyncIterator]();
async function ask(what) {
  console.log(JSON.stringify({ ask: what }));
  const { value, done } = await replies.next();
  if (done || value.trim() !== "ok") throw new Error(`the test did not ${what}: ${value}`);
}

const consoleErrors = [];
const failedRequests = [];
const result = { consoleErrors, failedRequests };

const profile = mkdtempSync(join(tmpdir(), "demo-chromium-")); // a fresh profile every run
const browser = await puppeteer.launch({
  executablePath,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage", // containers often have a tiny /dev/shm
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    `--user-data-dir=${profile}`,
  ],
});

try {
  const page = await browser.newPage();
  page.on("console", (message) => {
    if (message.type() === "error") consoleErrors.push(message.text());
  });
  page.on("pageerror", (error) => consoleErrors.push(`page error: ${error.message}`));
  page.on("requestfailed", (request) => failedRequests.push(request.url()));
  page.on("response", (response) => {
    if (response.status() >= 400) failedRequests.push(`${response.status()} ${response.url()}`);
  });
  await page.setViewport({ width: 1280, height: 900 });
  await page.goto(base, { waitUntil: "networkidle0" });

  const state = () => page.evaluate(() => speechDemo.state());
  const waitState = (predicate, timeout = 30_000) =>
    page.waitForFunction(predicate, { timeout, polling: 20 });
  const setText = (text) =>
    page.$eval("#text", (area, value) => {
      area.value = value;
    }, text);

  // ---------------------------------------------------------------- connect
  result.initialState = await state();
  await page.click("#connect");
  await waitState(() => speechDemo.state() === "ready");
  result.format = await page.$eval("#format", (select) => select.value);
  await page.screenshot({ path: `${outDir}/idle.png` });
  result.errorsAfterLoad = consoleErrors.length;

  // ---------------------------------------------------------------- speak, hear it
  await setText(SENTENCE);
  await page.click("#speak");
  await waitState(() => speechDemo.state() === "speaking");
  // A moment into the sentence, so the chart has something to show.
  await waitState(() => speechDemo.player().audio.currentTime > 0 && speechDemo.outputPeak() > 0.05);
  await page.screenshot({ path: `${outDir}/speaking.png` });
  // Sample the output every few ms until the utterance has played out.
  result.speak = await page.evaluate(async () => {
    let loudest = 0;
    let nonSilentSamples = 0;
    let samples = 0;
    const deadline = performance.now() + 60_000;
    while (speechDemo.state() !== "ready" && performance.now() < deadline) {
      const peak = speechDemo.outputPeak();
      loudest = Math.max(loudest, peak);
      samples += 1;
      if (peak > 0.01) nonSilentSamples += 1;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const player = speechDemo.player();
    return {
      finalState: speechDemo.state(),
      loudest,
      nonSilentShare: nonSilentSamples / Math.max(1, samples),
      decodedFrames: player.decodedFrames,
      receivedFrames: Number(document.getElementById("frames").textContent),
      scheduledS: player.scheduledS,
      underruns: player.underruns,
    };
  });
  result.ttfa = await page.$eval("#ttfa", (element) => element.textContent);

  // Click a button inside the page and measure, on the output analyser, how long
  // until the speakers get only zeros (and stay so for 300 ms).
  const silenceAfterClick = (buttonId) =>
    page.evaluate(async (id) => {
      const peakBefore = speechDemo.outputPeak();
      const bufferedBefore = speechDemo.player().bufferedS();
      const clickedAt = performance.now();
      document.getElementById(id).click();
      let silentSince = null;
      let lastLoud = null;
      const sample = () => {
        const now = performance.now();
        if (speechDemo.outputPeak() > 0) {
          silentSince = null;
          lastLoud = now - clickedAt;
        } else if (silentSince === null) {
          silentSince = now - clickedAt;
        }
        return silentSince !== null && now - clickedAt - silentSince > 300;
      };
      // The first 200 ms without yielding: a busy machine's timer delays must
      // not count as time the speakers were still playing (the audio thread
      // keeps rendering, and the analyser keeps answering, meanwhile).
      while (performance.now() - clickedAt < 200) sample();
      while (performance.now() - clickedAt < 1000 && !sample()) {
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      return {
        peakBefore,
        bufferedBefore,
        silentAfterMs: silentSince,
        lastLoudMs: lastLoud,
        state: speechDemo.state(),
        bufferedAfter: speechDemo.player()?.bufferedS() ?? 0,
      };
    }, buttonId);

  const speakLongAndWaitForBuffer = async (minBufferedS) => {
    await setText(LONG_TEXT);
    await page.click("#speak");
    await page.waitForFunction(
      (min) => speechDemo.player().bufferedS() > min && speechDemo.outputPeak() > 0.01,
      { timeout: 60_000, polling: 10 },
      minBufferedS,
    );
  };

  // ---------------------------------------------------------------- barge in on buffered audio
  await speakLongAndWaitForBuffer(2);
  result.bargeIn = await silenceAfterClick("cancel");
  await waitState(() => ["cancelled", "ready"].includes(speechDemo.state()));
  result.stateAfterBargeIn = await state();

  // ---------------------------------------------------------------- disconnect mid-playback
  await speakLongAndWaitForBuffer(2);
  result.disconnect = await silenceAfterClick("disconnect");
  result.stateAfterDisconnect = await state();

  // ---------------------------------------------------------------- the server goes away
  await page.click("#connect");
  await waitState(() => speechDemo.state() === "ready");
  await speakLongAndWaitForBuffer(1);
  result.errorsBeforeOutage = [...consoleErrors];
  result.failedBeforeOutage = [...failedRequests];
  await ask("stop-server");
  await waitState(() => speechDemo.state().startsWith("connection lost"));
  result.lost = await page.evaluate(() => ({
    state: speechDemo.state(),
    peak: speechDemo.outputPeak(),
    buffered: speechDemo.player().bufferedS(),
    log: [...document.querySelectorAll("#log li")].map((li) => li.textContent),
  }));
  // Back, but warming up: sessions are refused with a retryable 1013 until the test says.
  await ask("start-server-warming");
  const refusal = await page.waitForFunction(
    () => [...document.querySelectorAll("#log li")]
      .map((li) => li.textContent)
      .find((line) => line.includes("warming up")),
    { timeout: 60_000, polling: 20 },
  );
  result.warmingLine = await refusal.jsonValue();
  await ask("finish-warm-up");
  await waitState(() => speechDemo.state() === "ready", 60_000);
  result.reconnectedLog = await page.$$eval("#log li", (items) =>
    items.map((li) => li.textContent),
  );
  // The reconnected session really works: speak once more.
  await setText(SENTENCE);
  await page.click("#speak");
  await waitState(() => speechDemo.state() === "speaking");
  result.speaksAfterReconnect = true;

  // ---------------------------------------------------------------- empty text
  await page.click("#cancel");
  await setText("   ");
  await page.click("#speak");
  result.emptyHint = await page.$eval("#hint", (element) => element.textContent);

  // ---------------------------------------------------------------- narrow screens
  result.narrow = [];
  for (const width of [375, 420]) {
    await page.setViewport({ width, height: 800 });
    result.narrow.push(
      await page.evaluate(() => {
        const button = document.getElementById("disconnect").getBoundingClientRect();
        return {
          width: window.innerWidth,
          scrollWidth: document.documentElement.scrollWidth,
          disconnectRight: button.right,
        };
      }),
    );
  }
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify({ result }));
process.exit(0);
