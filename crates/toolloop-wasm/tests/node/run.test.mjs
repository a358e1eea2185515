// The npm package in Node, against toolloop's mock server (TOOLLOOP_MOCK_URL, started by
// tests/node.rs) and in-process JavaScript models.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { init, runLoop, streamLoop } from '../../npm/node.js';

const mock = process.env.TOOLLOOP_MOCK_URL;

const lookup = {
  name: 'lookup',
  description: 'Looks a word up.',
  parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] },
  run: async ({ word }) => ({ word, length: String(word).length }),
};

const add = {
  name: 'add',
  description: 'Adds two integers.',
  parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] },
  run: ({ a, b }) => a + b,
};

const bases = {
  openai: (b) => `${b}/v1`,
  'openai-responses': (b) => `${b}/v1`,
  anthropic: (b) => b,
  gemini: (b) => b,
};

for (const provider of Object.keys(bases)) {
  for (const stream of [false, true]) {
    test(`${provider} ${stream ? 'streamed' : 'complete'}: two rounds of tool calls against the mock`, { skip: !mock && 'TOOLLOOP_MOCK_URL is not set' }, async () => {
      const ran = [];
      const tool = { ...lookup, run: async (args) => { ran.push(args); return lookup.run(args); } };
      const events = [];
      const result = await runLoop({
        model: { provider, model: 'mock:rounds=2,distinct=true', baseUrl: bases[provider](mock), apiKey: 'sk-test', stream },
        tools: [tool],
        messages: [{ role: 'user', content: 'look two words up' }],
        onEvent: (e) => events.push(e.type),
      });
      assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
      assert.equal(result.text, 'Done. I saw 2 tool results in 2 rounds.');
      assert.equal(result.toolCalls.length, 2);
      assert.equal(ran.length, 2);
      assert.ok(result.toolCalls.every((c) => c.status === 'ok'), JSON.stringify(result.toolCalls));
      assert.ok(events.includes('tool_finished') && events.includes('run_finished'), events.join());
      if (stream) assert.ok(events.includes('text_delta'), events.join());
    });
  }
}

test('a server error is the run\'s typed stop reason', { skip: !mock && 'TOOLLOOP_MOCK_URL is not set' }, async () => {
  let posts = 0;
  const result = await runLoop({
    model: {
      provider: 'anthropic', model: 'mock:faults=1,fault_kinds=500', baseUrl: mock, apiKey: 'sk-secret-123',
      fetch: (url, init) => { posts += 1; return fetch(url, init); },
    },
    messages: [{ role: 'user', content: 'hi' }],
    limits: { modelRetries: 1 },
  });
  assert.equal(posts, 2, 'the failed call is retried once (modelRetries: 1), then the run ends');
  assert.equal(result.stopReason, 'model_error');
  assert.match(result.outcome.error.message, /500/);
  assert.ok(!JSON.stringify(result).includes('sk-secret-123'));
});

for (const stream of [false, true]) {
  test(`a model call that fails once with a retryable error is made again (${stream ? 'streamed' : 'complete'})`, { skip: !mock && 'TOOLLOOP_MOCK_URL is not set' }, async () => {
    const seen = [];
    // The server answers 503 to the first request (asking for no wait), then the mock answers.
    const flaky = (url, init) => {
      seen.push(url);
      if (seen.length === 1) {
        return Promise.resolve(new Response('{"error":{"type":"server_error","message":"busy"}}', {
          status: 503, headers: { 'content-type': 'application/json', 'retry-after': '0' },
        }));
      }
      return fetch(url, init);
    };
    const events = [];
    const result = await runLoop({
      model: { provider: 'openai', model: 'mock:rounds=1', baseUrl: `${mock}/v1`, apiKey: 'sk-test', stream, fetch: flaky },
      tools: [lookup],
      messages: [{ role: 'user', content: 'look a word up' }],
      onEvent: (e) => events.push(e),
    });
    assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
    assert.equal(result.toolCalls.length, 1);
    assert.equal(seen.length, 3, 'one failed call, its retry, the second round');
    const retries = events.filter((e) => e.type === 'model_retry');
    assert.equal(retries.length, 1, JSON.stringify(retries));
    assert.equal(retries[0].attempt, 2);
    assert.match(retries[0].reason, /503|busy/);
  });
}

test('retries stop at modelRetries: a server that keeps failing ends the run', { skip: !mock && 'TOOLLOOP_MOCK_URL is not set' }, async () => {
  let posts = 0;
  const result = await runLoop({
    model: {
      provider: 'gemini', model: 'mock:faults=1,fault_kinds=429', baseUrl: mock, apiKey: 'sk-test',
      fetch: (url, init) => { posts += 1; return fetch(url, init); },
    },
    messages: [{ role: 'user', content: 'hi' }],
    limits: { modelRetries: 0 },
  });
  assert.equal(posts, 1);
  assert.equal(result.stopReason, 'model_error');
});

/** A JavaScript model that plays `replies` in order and records what it was asked. */
function scripted(replies, extra = {}) {
  const asked = [];
  return {
    asked,
    model: { ...extra, complete: (request) => { asked.push(request); return replies[Math.min(asked.length - 1, replies.length - 1)]; } },
  };
}

test('a complete() model with native tool calls', async () => {
  const { model, asked } = scripted([
    { tool_calls: [{ name: 'add', arguments: { a: 2, b: 3 } }] },
    '2 + 3 = 5',
  ], { nativeTools: true });
  const result = await runLoop({ model, tools: [add], messages: [{ role: 'user', content: 'What is 2 + 3?' }] });
  assert.equal(result.stopReason, 'answered');
  assert.equal(result.text, '2 + 3 = 5');
  assert.equal(result.toolCalls[0].content, '{"success":true,"message":"ok","data":5}');
  assert.equal(asked[0].tools[0].name, 'add');
  assert.equal(asked[1].messages.at(-1).role, 'tool');
});

test('prompt-based calling: the catalog is taught in the prompt, the calls parsed from the text', async () => {
  const { model, asked } = scripted([
    'Let me add.\n<PTK_CALL>{"tool": "add", "args": {"a": 20, "b": 22}}</PTK_CALL>',
    'The sum is 42.',
  ]);
  const result = await runLoop({ model, tools: [add], messages: [{ role: 'user', content: 'add 20 and 22' }] });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(result.text, 'The sum is 42.');
  assert.equal(result.toolCalls.length, 1);
  assert.equal(result.toolCalls[0].call.name, 'add');
  assert.equal(asked[0].tools.length, 0, 'the model gets no native tools');
  assert.match(asked[0].messages[0].content, /PTK_CALL/);
  assert.match(JSON.stringify(asked[1].messages), /PTK_RESULT/);
});

test('a duplicate call is refused by the engine and the budget ends the run with a typed reason', async () => {
  const ran = [];
  const { model } = scripted([{ tool_calls: [{ name: 'add', arguments: { a: 1, b: 1 } }] }], { nativeTools: true });
  const tool = { ...add, run: (x) => { ran.push(x); return add.run(x); } };
  const result = await runLoop({ model, tools: [tool], messages: [{ role: 'user', content: 'loop' }], limits: { maxRounds: 3 } });
  assert.equal(result.stopReason, 'max_rounds');
  assert.equal(ran.length, 1, 'the repeats never ran');
  assert.equal(result.toolCalls.length, 3, 'every call has exactly one result');
});

test('an AbortSignal reaches the running tool and cancels the run', async () => {
  const controller = new AbortController();
  let sawAbort = false;
  const slow = {
    name: 'slow', description: 'Waits.', parameters: { type: 'object' },
    run: (_args, { signal }) => new Promise((resolve) => {
      signal.addEventListener('abort', () => { sawAbort = true; resolve('stopped'); });
      setTimeout(() => controller.abort(), 5);
    }),
  };
  const { model } = scripted([{ tool_calls: [{ name: 'slow', arguments: {} }] }, 'never'], { nativeTools: true });
  const result = await runLoop({ model, tools: [slow], messages: [{ role: 'user', content: 'wait' }], signal: controller.signal });
  assert.ok(sawAbort);
  assert.equal(result.stopReason, 'cancelled');
});

test('a saved state goes on in another run', async () => {
  const first = scripted([{ tool_calls: [{ name: 'add', arguments: { a: 1, b: 2 } }] }], { nativeTools: true });
  let saved = null;
  const controller = new AbortController();
  const tool = { ...add, run: (x) => { const r = add.run(x); return r; } };
  await runLoop({
    model: first.model, tools: [tool], messages: [{ role: 'user', content: 'add' }], checkpoints: true, signal: controller.signal,
    onEvent: (e) => { if (e.type === 'checkpoint' && !saved) { saved = JSON.stringify(e.state); controller.abort(); } },
  });
  assert.ok(saved, 'a checkpoint came');
  const second = scripted(['1 + 2 = 3'], { nativeTools: true });
  const result = await runLoop({ model: second.model, tools: [tool], state: saved });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(result.text, '1 + 2 = 3');
  assert.equal(result.toolCalls.length, 1);
});

test('streamLoop yields the events, then the result', async () => {
  const { model } = scripted([{ tool_calls: [{ name: 'add', arguments: { a: 4, b: 4 } }] }, 'eight'], { nativeTools: true });
  const types = [];
  let result = null;
  for await (const item of streamLoop({ model, tools: [add], messages: [{ role: 'user', content: '4+4' }] })) {
    types.push(item.type);
    if (item.type === 'result') result = item.result;
  }
  assert.equal(types.at(-1), 'result');
  assert.ok(types.includes('tool_started'));
  assert.equal(result.text, 'eight');
});

/** How `promise` settles, or `never settled` after five seconds. */
function settled(promise) {
  let timer;
  const never = new Promise((r) => { timer = setTimeout(() => r({ how: 'never settled' }), 5000); });
  return Promise.race([
    promise.then((value) => ({ how: 'resolved', value }), (error) => ({ how: 'rejected', error })),
    never,
  ]).finally(() => clearTimeout(timer));
}

// The engine's own `run`, with a host written against it (not the wrapper's, which hands the
// engine plain values): what the host's values run when read (a getter, a proxy's trap, a
// `toString`) may throw, and the run still settles, with the error as its own.
test('a host whose values throw when read: the run settles', async () => {
  const engine = await init();
  const spec = JSON.stringify({
    model: { provider: 'openai', model: 'm', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'sk-test' },
    messages: [{ role: 'user', content: 'hi' }],
    limits: { modelRetries: 0 },
  });
  const body = new TextEncoder().encode(
    '{"choices":[{"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}');
  // Headers with a getter that throws, and a proxy whose trap throws.
  const heads = [
    { 'content-type': 'application/json', get 'x-trap'() { throw new Error('a getter'); } },
    new Proxy({}, { ownKeys() { throw new Error('a trap'); } }),
  ];
  for (const headers of heads) {
    let sent = false;
    const host = {
      http: async () => ({ status: 200, headers, read: async () => (sent ? undefined : ((sent = true), body)) }),
    };
    const out = await settled(engine.run(spec, host));
    assert.equal(out.how, 'resolved', String(out.error ?? out.how));
    assert.equal(JSON.parse(out.value).text, 'hello');
  }
  // A rejection whose message throws when made text.
  const odd = new Error();
  Object.defineProperty(odd, 'message', { value: { toString() { throw new Error('formatting'); } } });
  const failing = { http: async () => { throw odd; } };
  const out = await settled(engine.run(spec, failing));
  assert.equal(out.how, 'resolved', String(out.error ?? out.how));
  const result = JSON.parse(out.value);
  assert.equal(result.stopReason, 'model_error', JSON.stringify(result.outcome));
  assert.match(result.outcome.error.message, /http: /);
});

// A server that streams without end (comments, which make no event): the run ends with the
// body's limit (32 MiB, as natively), not with the module's memory.
test('a stream that never ends is cut at the body limit', async () => {
  const engine = await init();
  const spec = JSON.stringify({
    model: { provider: 'openai', model: 'm', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'sk-test', stream: true },
    messages: [{ role: 'user', content: 'hi' }],
    limits: { modelRetries: 0 },
  });
  const chunk = new TextEncoder().encode(`: ${'x'.repeat(1 << 20)}\n\n`);
  let stopped = false;
  const host = {
    http: async () => ({
      status: 200,
      headers: { 'content-type': 'text/event-stream' },
      // After other tasks (timers): a body read as fast as it is made would starve them.
      read: () => new Promise((r) => setImmediate(() => r(stopped ? undefined : chunk))),
    }),
  };
  const out = await settled(engine.run(spec, host));
  stopped = true;
  assert.equal(out.how, 'resolved', String(out.error ?? out.how));
  const result = JSON.parse(out.value);
  assert.equal(result.stopReason, 'model_error', JSON.stringify(result.outcome));
  assert.match(result.outcome.error.message, /limit of 33554432 bytes/);
});
