// The conformance corpus (crates/toolloop/tests/conformance) through the WebAssembly build's
// decoders, compared as crates/toolloop/tests/conformance.rs compares the native ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const corpus = path.resolve(here, '../../../toolloop/tests/conformance');
const engine = createRequire(import.meta.url)('../../npm/pkg/node/toolloop_wasm.js');

function meaning(d, anthropicUsage) {
  const r = d.response;
  const calls = r.tool_calls.map((c) => (c.invalid_arguments != null
    ? { id: c.id, name: c.name, arguments: null, arguments_raw: c.invalid_arguments }
    : { id: c.id, name: c.name, arguments: c.arguments }));
  const usage = r.usage && {
    input_tokens: anthropicUsage
      ? r.usage.input_tokens - (r.usage.cache_read_tokens ?? 0) - (r.usage.cache_write_tokens ?? 0)
      : r.usage.input_tokens,
    output_tokens: r.usage.output_tokens,
  };
  const v = { text: r.text ?? null, tool_calls: calls, finish_reason: r.finish_reason, usage: usage ?? null };
  if (d.error) {
    v.finish_reason = 'error';
    v.error = { http_status: d.error.status, type: d.error.error_type ?? null, code: d.error.code ?? null, message: d.error.message };
  }
  return v;
}

const apis = { 'openai-chat': false, 'openai-responses': false, 'anthropic-messages': true, gemini: false };

for (const [api, anthropicUsage] of Object.entries(apis)) {
  test(`the ${api} corpus decodes in WebAssembly as natively`, () => {
    const dirs = readdirSync(corpus).sort().map((d) => path.join(corpus, d)).filter((d) => existsSync(path.join(d, 'meta.json')));
    let n = 0;
    const failures = [];
    for (const dir of dirs) {
      const meta = JSON.parse(readFileSync(path.join(dir, 'meta.json'), 'utf8'));
      if (meta.api !== api) continue;
      n += 1;
      const body = readFileSync(path.join(dir, meta.response_file));
      const d = JSON.parse(engine.decodeRecorded(api, meta.http_status, body, meta.stream));
      const got = meaning(d, anthropicUsage);
      const want = JSON.parse(readFileSync(path.join(dir, 'expected.json'), 'utf8'));
      (want.tool_calls ?? []).forEach((w, i) => { if (w.id == null && got.tool_calls[i]) w.id = got.tool_calls[i].id; });
      if (want.error && typeof want.error.code === 'number') want.error.code = String(want.error.code);
      try { assert.deepStrictEqual(got, want); } catch { failures.push(`${path.basename(dir)}:\n  expected ${JSON.stringify(want)}\n  got      ${JSON.stringify(got)}`); }
    }
    assert.ok(n > 0, `no ${api} cases`);
    assert.deepEqual(failures, [], `${failures.length} of ${n} cases failed`);
  });
}
