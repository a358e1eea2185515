// Opens `toolloop eval --html`'s report in headless Chromium (puppeteer-core, from
// tools/npm/package-lock.json; run by eval.rs).
//
// usage: node eval_report.mjs NODE_MODULES CHROMIUM REPORT.html SCREENSHOT.png
//
// Reads the summary table, checks that the first failed row's transcript is hidden, opens it
// with a click and reads it, and takes a screenshot. Prints one JSON line of what it saw; a
// failure throws.

import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, chromium, report, screenshot] = process.argv.slice(2);
const require = createRequire(path.join(modules, "noop.js"));
const puppeteer = require("puppeteer-core");

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const seen = { requests: [] };
try {
  const page = await browser.newPage();
  // Anything the page asks for beyond its own file is a failure of the report.
  page.on("request", (r) => {
    if (!r.url().startsWith("file:")) seen.requests.push(r.url());
  });
  page.on("dialog", async (d) => {
    seen.dialog = d.message();
    await d.dismiss();
  });
  await page.setViewport({ width: 1200, height: 900 });
  await page.goto(pathToFileURL(report).href, { waitUntil: "load" });
  seen.title = await page.title();
  seen.rows = await page.$$eval("#summary tbody tr", (rows) =>
    rows.map((r) => ({
      case: r.querySelector("td.case").textContent,
      variant: r.querySelector("td.variant").textContent,
      rate: r.querySelector("td.rate").textContent,
      class: r.className,
    })),
  );
  const row = (await page.$("#summary tbody tr.fail")) ?? (await page.$("#summary tbody tr"));
  const details = await row.$("details.transcript");
  const firstRun = await details.$(".run");
  const visible = (e) => e.evaluate((el) => el.checkVisibility() && el.getClientRects().length > 0);
  seen.visible_before = await visible(firstRun);
  seen.text_before = await details.evaluate((d) => d.innerText);
  await (await details.$("summary")).click();
  seen.open_after = await details.evaluate((d) => d.open);
  seen.visible_after = await visible(firstRun);
  seen.transcript = await details.evaluate((d) => d.innerText);
  seen.scripts = await page.$$eval("script", (s) => s.length);
  seen.pwned = await page.evaluate(() => window.__pwned === true);
  await page.screenshot({ path: screenshot, fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
