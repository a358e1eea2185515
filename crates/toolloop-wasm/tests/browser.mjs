// The demo page in headless Chromium (puppeteer-core from tools/npm): it loads, a run with tool
// calls finishes, and a screenshot is saved. Usage: node browser.mjs CHROMIUM SCREENSHOT
import http from 'node:http';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [chromium, screenshot] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../npm');
const require = createRequire(path.resolve(here, '../../../tools/npm/package.json'));
const puppeteer = require('puppeteer-core');

const types = { '.html': 'text/html', '.js': 'text/javascript', '.wasm': 'application/wasm' };
const server = http.createServer(async (req, res) => {
  const file = path.resolve(root, '.' + decodeURIComponent(new URL(req.url, 'http://x').pathname));
  if (!file.startsWith(root)) { res.writeHead(403).end(); return; }
  try {
    const body = await readFile(file);
    res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream' }).end(body);
  } catch { res.writeHead(404).end(); }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/demo/index.html`;
const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById('status').textContent === 'ready', { timeout: 30000 });
  await page.click('button');
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('done'), { timeout: 30000 });
  const result = await page.evaluate(() => window.lastResult);
  await page.screenshot({ path: screenshot, fullPage: true });
  if (errors.length) throw new Error(`page errors: ${errors.join('; ')}`);
  if (result.stopReason !== 'answered' || result.toolCalls.length !== 2 || !/= 42/.test(result.text)) {
    throw new Error(`unexpected result: ${JSON.stringify(result)}`);
  }
  console.log(`browser: ${result.text} (${result.toolCalls.length} tool calls); screenshot ${screenshot}`);
} finally {
  await browser.close();
  server.close();
}
