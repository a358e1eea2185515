// The Rust library's guarantees in the JavaScript driver, in Node: what a JavaScript model is
// sent (only what changed), tool retries and time limits, the run's time limit, approvals and
// the context policy. In-process models and tools only (no server).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { init, runLoop, runWith } from '../../npm/node.js';

/** A JavaScript model that plays `replies` in order (a function of the request when one is a
 * function) and records a copy of what it was asked. */
function scripted(replies, extra = {}) {
  const asked = [];
  let n = 0;
  return {
    asked,
    model: {
      nativeTools: true,
      ...extra,
      complete: (request) => {
        asked.push(structuredClone(request));
        const reply = replies[Math.min(n++, replies.length - 1)];
        return typeof reply === 'function' ? reply(request) : reply;
      },
    },
  };
}

const call = (name, args = {}) => ({ tool_calls: [{ name, arguments: args }] });

/** The engine, with a record of the raw requests it sends a JavaScript model. */
async function recording() {
  const engine = await init();
  const raw = [];
  return {
    raw,
    engine: {
      run: (spec, host) => {
        const complete = host.complete;
        host.complete = (request) => { raw.push(JSON.parse(request)); return complete.call(host, request); };
        return engine.run(spec, host);
      },
    },
  };
}

test('a JavaScript model is sent only what changed; it still gets the whole conversation', async () => {
  const { raw, engine } = await recording();
  const echo = { name: 'echo', description: 'Echoes.', parameters: { type: 'object' }, run: ({ n }) => n };
  const { model, asked } = scripted([call('echo', { n: 1 }), call('echo', { n: 2 }), call('echo', { n: 3 }), 'done']);
  const result = await runWith(engine, { model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 6 } });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(raw.length, 4);
  // The first request carries the conversation, the tools and the settings; each later one
  // the round's assistant turn and tool result only, after what the model already has.
  assert.deepEqual(raw.map((r) => [r.from, r.messages.length]), [[0, 1], [1, 2], [3, 2], [5, 2]]);
  assert.equal(raw[0].tools.length, 1);
  assert.ok(raw.slice(1).every((r) => r.tools === undefined && r.settings === undefined), JSON.stringify(raw[1]));
  // The model reads the whole conversation each round, in a copy of its own.
  assert.deepEqual(asked.map((r) => r.messages.length), [1, 3, 5, 7]);
  assert.deepEqual(asked.map((r) => r.tools.map((t) => t.name)), [['echo'], ['echo'], ['echo'], ['echo']]);
  assert.deepEqual(asked[3].messages, result.messages.slice(0, 7));
});

test('a tool error marked retryable is retried with backoff, up to toolRetries', async () => {
  const attempts = [];
  const flaky = {
    name: 'flaky', description: 'Fails twice.', parameters: { type: 'object' },
    run: (_args, { attempt }) => {
      attempts.push(attempt);
      if (attempt < 3) throw Object.assign(new Error(`try ${attempt} failed`), { retryable: true });
      return 'ok at last';
    },
  };
  const events = [];
  const { model } = scripted([call('flaky'), 'done']);
  const result = await runLoop({
    model, tools: [flaky], messages: [{ role: 'user', content: 'go' }],
    limits: { toolRetries: 2, toolRetryBackoffMs: 1 }, onEvent: (e) => events.push(e),
  });
  assert.equal(result.stopReason, 'answered');
  assert.deepEqual(attempts, [1, 2, 3]);
  assert.equal(result.toolCalls[0].status, 'ok', JSON.stringify(result.toolCalls[0]));
  assert.equal(result.toolCalls[0].attempts, 3);
  assert.deepEqual(events.filter((e) => e.type === 'tool_started').map((e) => e.attempt), [1, 2, 3]);

  // One retry only: the second failure is the call's result. An error not marked retryable
  // is not retried.
  for (const [limits, retryable, expected] of [[{ toolRetries: 1, toolRetryBackoffMs: 1 }, true, 2], [{}, false, 1]]) {
    let tries = 0;
    const failing = { ...flaky, run: () => { tries += 1; throw Object.assign(new Error('down'), { retryable }); } };
    const again = scripted([call('flaky'), 'done']);
    const r = await runLoop({ model: again.model, tools: [failing], messages: [{ role: 'user', content: 'go' }], limits });
    assert.equal(tries, expected);
    assert.equal(r.toolCalls[0].attempts, expected);
    assert.notEqual(r.toolCalls[0].status, 'ok');
    assert.match(r.toolCalls[0].content, /down/);
  }
});

test('an attempt past toolTimeoutMs fails with a retryable error and its signal is aborted', async () => {
  const signals = [];
  const hang = {
    name: 'hang', description: 'Never answers.', parameters: { type: 'object' },
    // Ignores its signal: the time limit holds all the same.
    run: (_args, { signal }) => { signals.push(signal); return new Promise(() => {}); },
  };
  const { model } = scripted([call('hang'), 'done']);
  const started = Date.now();
  const result = await runLoop({
    model, tools: [hang], messages: [{ role: 'user', content: 'go' }],
    limits: { toolTimeoutMs: 100, toolRetries: 1, toolRetryBackoffMs: 1 },
  });
  assert.equal(result.stopReason, 'answered');
  assert.equal(signals.length, 2, 'the attempt past the limit was made again once');
  assert.ok(signals.every((s) => s.aborted));
  assert.equal(result.toolCalls[0].attempts, 2);
  assert.match(result.toolCalls[0].content, /did not finish within 0\.1s/);
  assert.ok(Date.now() - started < 5000);
});

test('the run stops with `timeout` at timeoutMs, even inside a tool that ignores its signal', async () => {
  let signal = null;
  const hang = {
    name: 'hang', description: 'Never answers.', parameters: { type: 'object' },
    run: (_args, ctx) => { signal = ctx.signal; return new Promise(() => {}); },
  };
  const { model } = scripted([call('hang'), 'done']);
  const started = Date.now();
  const result = await runLoop({ model, tools: [hang], messages: [{ role: 'user', content: 'go' }], limits: { timeoutMs: 150 } });
  assert.equal(result.stopReason, 'timeout', JSON.stringify(result.outcome));
  assert.ok(signal.aborted, 'the tool was told');
  assert.ok(Date.now() - started < 5000);
  assert.equal(result.toolCalls.length, 1, 'the call has its one result');

  // A model that never answers is cut short the same way.
  const silent = { nativeTools: true, complete: () => new Promise(() => {}) };
  const r = await runLoop({ model: silent, messages: [{ role: 'user', content: 'go' }], limits: { timeoutMs: 100 } });
  assert.equal(r.stopReason, 'timeout');
});

test('a tool that needs approval asks approve(call): approved it runs, denied it does not', async () => {
  const ran = [];
  const remove = {
    name: 'remove', description: 'Removes a file.', needsApproval: true,
    parameters: { type: 'object', properties: { path: { type: 'string' } } },
    run: ({ path }) => { ran.push(path); return `removed ${path}`; },
  };
  const asked = [];
  const approve = (pending) => {
    asked.push(pending);
    return pending.call.arguments.path === '/tmp/a' ? true : { approved: false, reason: 'not that one' };
  };
  const { model } = scripted([
    { tool_calls: [{ name: 'remove', arguments: { path: '/tmp/a' } }, { name: 'remove', arguments: { path: '/etc/b' } }] },
    'done',
  ]);
  const events = [];
  const result = await runLoop({
    model, tools: [remove], messages: [{ role: 'user', content: 'clean up' }], approve, onEvent: (e) => events.push(e.type),
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.deepEqual(ran, ['/tmp/a']);
  assert.deepEqual(asked.map((p) => p.call.name), ['remove', 'remove']);
  assert.equal(result.toolCalls[1].status, 'denied', JSON.stringify(result.toolCalls[1]));
  assert.match(result.toolCalls[1].content, /not that one/);
  assert.ok(events.includes('approval_requested'), events.join());

  // A tool without the mark runs without asking; a handler that throws denies.
  const free = { ...remove, name: 'free', needsApproval: false };
  ran.length = 0;
  const two = scripted([{ tool_calls: [{ name: 'free', arguments: { path: 'x' } }, { name: 'remove', arguments: { path: 'y' } }] }, 'done']);
  const r = await runLoop({ model: two.model, tools: [free, remove], messages: [{ role: 'user', content: 'go' }], approve: () => { throw new Error('no one is there'); } });
  assert.deepEqual(ran, ['x']);
  assert.equal(r.toolCalls[1].status, 'denied');
  assert.match(r.toolCalls[1].content, /no one is there/);
});

test('without approve, the run stops awaiting approval; its state goes on with one', async () => {
  const ran = [];
  const remove = { name: 'remove', description: 'Removes.', needsApproval: true, parameters: { type: 'object' }, run: () => { ran.push(1); return 'removed'; } };
  const first = scripted([call('remove')]);
  const waiting = await runLoop({ model: first.model, tools: [remove], messages: [{ role: 'user', content: 'go' }] });
  assert.equal(waiting.stopReason, 'awaiting_approval', JSON.stringify(waiting.outcome));
  assert.equal(ran.length, 0);
  assert.equal(waiting.outcome.pending_approvals.length, 1);
  const second = scripted(['removed it']);
  const result = await runLoop({ model: second.model, tools: [remove], state: waiting.state, approve: () => true });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(ran.length, 1);
  assert.equal(result.text, 'removed it');
});

test('a context policy that does not hold is refused, naming the field', async () => {
  const { model } = scripted(['hi']);
  await assert.rejects(
    runLoop({ model, messages: [{ role: 'user', content: 'hi' }], context: { compactAt: 3 } }),
    /the context policy: compact_at is 3/,
  );
});

test('the context policy: a long result is spilled and read back with read_result', async () => {
  const long = Array.from({ length: 40 }, (_, i) => `line ${i} of the report`).join('\n');
  let ran = 0;
  const report = { name: 'report', description: 'A long report.', parameters: { type: 'object' }, run: () => { ran += 1; return long; } };
  const { model, asked } = scripted([
    call('report'),
    (request) => {
      const preview = request.messages.at(-1);
      const handle = /handle="([^"]+)"/.exec(preview.content)[1];
      return call('read_result', { handle, offset: 0, limit: 200 });
    },
    'read it',
  ]);
  const result = await runLoop({
    model, tools: [report], messages: [{ role: 'user', content: 'report' }],
    context: { spillOver: 300, spillPreview: 40 }, limits: { maxResultChars: 0 },
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(ran, 1);
  assert.ok(asked[1].messages.at(-1).content.length < long.length, 'the model read a preview');
  assert.match(asked[1].messages.at(-1).content, /read_result/);
  assert.deepEqual(asked[1].tools.map((t) => t.name), ['report', 'read_result'], 'read_result is offered once a result was spilled');
  assert.equal(result.toolCalls[1].call.name, 'read_result');
  assert.equal(result.toolCalls[1].status, 'ok');
  assert.match(asked[2].messages.at(-1).content, /line 0 of the report/);
});

test('the context policy: old results are cleared, and the model reads the conversation as the engine sends it', async () => {
  const { raw, engine } = await recording();
  const big = 'x'.repeat(500);
  const fetchit = { name: 'fetch', description: 'Fetches.', parameters: { type: 'object' }, run: () => big };
  const { model, asked } = scripted([call('fetch', { n: 1 }), call('fetch', { n: 2 }), call('fetch', { n: 3 }), call('fetch', { n: 4 }), 'done']);
  const result = await runWith(engine, {
    model, tools: [fetchit], messages: [{ role: 'user', content: 'fetch' }],
    context: { keepRounds: 1, spillOver: null }, limits: { maxResultChars: 0, maxRounds: 8 },
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  const last = asked.at(-1).messages;
  const cleared = last.filter((m) => m.role === 'tool' && /cleared from the context/.test(m.content));
  assert.ok(cleared.length >= 2, JSON.stringify(last.map((m) => m.content ?? m.text)));
  assert.equal(last.at(-1).content.includes(big), true, 'the latest result is whole');
  // A clearing replaced messages the model had: that request started before them.
  assert.ok(raw.some((r, i) => i > 0 && r.from < asked[i - 1].messages.length), JSON.stringify(raw.map((r) => r.from)));
});

test('the context policy: past the window the conversation is compacted by the model', async () => {
  // Long turns of the model's own (which clearing results does not shrink), small results.
  const ok = { name: 'fetch', description: 'Fetches.', parameters: { type: 'object' }, run: () => 'ok' };
  let round = 0;
  const summaries = [];
  const seen = [];
  const model = {
    nativeTools: true,
    complete: (request) => {
      seen.push(structuredClone(request));
      if (request.messages.some((m) => typeof m.content === 'string' && m.content.includes('--- conversation to summarise ---'))) {
        summaries.push(request);
        return 'SUMMARY: fetched several times';
      }
      round += 1;
      return round < 8 ? { text: `step ${round}: ${'thinking '.repeat(100)}`, tool_calls: [{ name: 'fetch', arguments: { n: round } }] } : 'done';
    },
  };
  const result = await runLoop({
    model, tools: [ok], messages: [{ role: 'user', content: 'fetch' }],
    context: { window: 1500, compactAt: 0.5, spillOver: null }, limits: { maxRounds: 12 },
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.ok(summaries.length >= 1, 'the model was asked for a summary');
  assert.equal(summaries[0].tools.length, 0, 'a summarisation offers no tools');
  assert.ok(result.outcome.context.compactions >= 1, JSON.stringify(result.outcome.context));
  const after = seen.at(-1).messages;
  assert.ok(after.some((m) => typeof m.content === 'string' && m.content.includes('SUMMARY: fetched several times')), JSON.stringify(after));
  assert.ok(after.length < result.messages.length, 'the model reads the compacted conversation');
});

test('hooks: reminders go with one round\'s request; stopWhen ends the run with its signal', async () => {
  const echo = { name: 'echo', description: 'Echoes.', parameters: { type: 'object' }, run: ({ n }) => n };
  const { model, asked } = scripted([call('echo', { n: 1 }), call('echo', { n: 2 }), call('echo', { n: 3 }), 'done']);
  const views = [];
  const result = await runLoop({
    model, tools: [echo], messages: [{ role: 'user', content: 'go' }],
    reminders: (view) => { views.push(view); return [`round ${view.round} of 5`]; },
    stopWhen: (calls) => (calls.some((c) => c.result?.ok?.data === 2) ? 'saw two' : null),
  });
  assert.equal(result.stopReason, 'terminal_signal', JSON.stringify(result.outcome));
  assert.equal(result.outcome.signal, 'saw two');
  assert.equal(asked.length, 2, 'the run ended after the second round\'s calls');
  assert.deepEqual(asked.map((r) => r.reminders), [['round 1 of 5'], ['round 2 of 5']]);
  assert.deepEqual(views.map((v) => v.round), [1, 2]);
  assert.equal(views[1].toolCalls, 1);
  assert.ok(!JSON.stringify(result.messages).includes('round 1 of 5'), 'reminders are not kept in the conversation');

  // Hooks that throw: no reminders, no stop.
  const again = scripted([call('echo', { n: 1 }), 'done']);
  const r = await runLoop({
    model: again.model, tools: [echo], messages: [{ role: 'user', content: 'go' }],
    reminders: () => { throw new Error('broken'); }, stopWhen: () => { throw new Error('broken'); },
  });
  assert.equal(r.stopReason, 'answered', JSON.stringify(r.outcome));
  assert.deepEqual(again.asked.map((q) => q.reminders), [[], []]);
});

test('onRoundLimit: grants more rounds, ends the run with a signal, or stops it at the limit', async () => {
  const echo = { name: 'echo', description: 'Echoes.', parameters: { type: 'object' }, run: ({ n }) => n };
  const calls = (k) => Array.from({ length: k }, (_, i) => call('echo', { n: i + 1 }));
  // Granted two more rounds once: the model answers in round 4, after the limit of 2.
  const views = [];
  const granted = scripted([...calls(3), 'done']);
  const r1 = await runLoop({
    model: granted.model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 2 },
    onRoundLimit: (view) => { views.push(view); return views.length === 1 ? { extend: 2 } : 'stop'; },
  });
  assert.equal(r1.stopReason, 'answered', JSON.stringify(r1.outcome));
  assert.equal(r1.text, 'done');
  assert.equal(granted.asked.length, 4);
  assert.deepEqual(views.map((v) => [v.round, v.toolCalls]), [[2, 2]]);

  // Asked again at the new limit: stopped there.
  const twice = scripted(calls(10));
  const asked = [];
  const r2 = await runLoop({
    model: twice.model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 2 },
    onRoundLimit: async ({ round }) => { asked.push(round); return round < 4 ? { extend: 1 } : 'stop'; },
  });
  assert.equal(r2.stopReason, 'max_rounds', JSON.stringify(r2.outcome));
  assert.deepEqual(asked, [2, 3, 4]);
  assert.equal(twice.asked.length, 4);

  // A signal ends the run with it.
  const signalled = scripted(calls(10));
  const r3 = await runLoop({
    model: signalled.model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 3 },
    onRoundLimit: () => ({ signal: 'out of rounds, wrapping up' }),
  });
  assert.equal(r3.stopReason, 'terminal_signal', JSON.stringify(r3.outcome));
  assert.equal(r3.outcome.signal, 'out of rounds, wrapping up');
  assert.equal(signalled.asked.length, 3);

  // The most rounds there can be: the limit does not wrap around to below the rounds run.
  const most = scripted([...calls(2), 'done']);
  let grants = 0;
  const r4 = await runLoop({
    model: most.model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 2 },
    onRoundLimit: () => (grants++ === 0 ? { extend: 2 ** 32 - 1 } : 'stop'),
  });
  assert.equal(r4.stopReason, 'answered', JSON.stringify(r4.outcome));
  assert.equal(grants, 1);

  // A hook that throws, or answers nonsense (no positive whole number of rounds), stops the
  // run at the limit, as without the hook.
  for (const hook of [() => { throw new Error('broken'); }, () => ({ extend: 0 }), () => ({ extend: 1.5 }), () => ({ extend: -3 }), () => 7]) {
    const m = scripted(calls(10));
    const r = await runLoop({ model: m.model, tools: [echo], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: 2 }, onRoundLimit: hook });
    assert.equal(r.stopReason, 'max_rounds', `${hook}: ${JSON.stringify(r.outcome)}`);
    assert.equal(m.asked.length, 2, String(hook));
  }
});

test('approval rules: globs over the tool and the call\'s subject allow, deny or ask, deny winning', async () => {
  const ran = [];
  const shell = {
    name: 'shell', description: 'Runs a command.', needsApproval: true,
    parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] },
    approvalSubject: ({ command }) => command,
    run: ({ command }) => { ran.push(command); return `ran ${command}`; },
  };
  // No approvalSubject: rules match the call's canonical JSON arguments.
  const fetchUrl = {
    name: 'fetch_url', description: 'Fetches.', parameters: { type: 'object', properties: { url: { type: 'string' } } },
    run: ({ url }) => { ran.push(url); return 'page'; },
  };
  const asked = [];
  const { model } = scripted([
    { tool_calls: [
      { name: 'shell', arguments: { command: 'git status --short' } }, // allowed by its rule
      { name: 'shell', arguments: { command: 'RM -rf /' } }, // denied (deny ignores case), never asked
      { name: 'shell', arguments: { command: 'git status; rm -rf ~' } }, // allowed and denied: deny wins
      { name: 'shell', arguments: { command: 'ls' } }, // no rule: its tool's default, ask
      { name: 'fetch_url', arguments: { url: 'https://intranet.example/x' } }, // denied by its arguments
      { name: 'fetch_url', arguments: { url: 'https://example.org/' } }, // its own default: allow
    ] },
    'done',
  ]);
  const result = await runLoop({
    model, tools: [shell, fetchUrl], messages: [{ role: 'user', content: 'go' }],
    limits: { detectDuplicates: false },
    approvals: {
      rules: [
        { action: 'allow', tool: 'shell', subject: 'git status*' },
        { action: 'deny', tool: 'shell', subject: '*rm *' },
        { action: 'deny', tool: 'fetch_*', subject: '*intranet.example*' },
      ],
    },
    approve: (pending) => { asked.push(pending.subject); return true; },
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.deepEqual(ran, ['git status --short', 'ls', 'https://example.org/']);
  assert.deepEqual(asked, ['ls'], 'only the call no allow or deny rule decided is asked about, by its subject');
  assert.deepEqual(result.toolCalls.map((c) => c.status), ['ok', 'denied', 'denied', 'ok', 'denied', 'ok'], JSON.stringify(result.toolCalls));
  assert.match(result.toolCalls[1].content, /deny shell:\*rm \*/);
  assert.match(result.toolCalls[4].content, /intranet/);

  // A subject the tool fails to give is uncertain: every deny rule of the tool matches it.
  ran.length = 0;
  const broken = { ...shell, approvalSubject: () => { throw new Error('cannot tell'); } };
  const m2 = scripted([{ tool_calls: [{ name: 'shell', arguments: { command: 'git status' } }] }, 'done']);
  const r2 = await runLoop({
    model: m2.model, tools: [broken], messages: [{ role: 'user', content: 'go' }],
    approvals: { rules: [{ action: 'allow', tool: 'shell', subject: 'git status*' }, { action: 'deny', tool: 'shell', subject: 'rm *' }] },
  });
  assert.equal(r2.toolCalls[0].status, 'denied', JSON.stringify(r2.toolCalls));
  assert.match(r2.toolCalls[0].content, /cannot tell/);
  assert.deepEqual(ran, []);

  // `default: 'deny'` denies what no rule allows; a glob that does not compile refuses the run.
  const m3 = scripted([{ tool_calls: [{ name: 'fetch_url', arguments: { url: 'https://example.org/' } }] }, 'done']);
  const r3 = await runLoop({ model: m3.model, tools: [fetchUrl], messages: [{ role: 'user', content: 'go' }], approvals: { default: 'deny' } });
  assert.equal(r3.toolCalls[0].status, 'denied', JSON.stringify(r3.toolCalls));
  assert.deepEqual(ran, []);
  await assert.rejects(
    runLoop({ model: m3.model, tools: [fetchUrl], messages: [{ role: 'user', content: 'go' }], approvals: { rules: [{ action: 'deny', tool: 'fetch_[' }] } }),
    /approval rule `deny fetch_\[`/,
  );
  await assert.rejects(
    runLoop({ model: m3.model, tools: [fetchUrl], messages: [{ role: 'user', content: 'go' }], approvals: { rule: [] } }),
    /unknown field `rule`/,
  );
});

test('parallel-safe calls of a round run at once, at most maxParallel; others one after another, in order', async () => {
  const log = [];
  let running = 0;
  let peak = 0;
  const tool = (name, parallelSafe, ms) => ({
    name, description: name, parallelSafe, parameters: { type: 'object', properties: { n: { type: 'integer' } } },
    run: async ({ n }) => {
      running++;
      peak = Math.max(peak, running);
      log.push(`start ${name}${n}`);
      await new Promise((r) => setTimeout(r, ms(n)));
      running--;
      log.push(`end ${name}${n}`);
      return `${name}${n}`;
    },
  });
  // The first fetch finishes last; the results still come in the calls' order.
  const fetch_ = tool('fetch', true, (n) => (n === 1 ? 60 : 10));
  const write = tool('write', false, () => 10);
  const calls = [['fetch', 1], ['fetch', 2], ['fetch', 3], ['write', 4], ['fetch', 5]].map(([name, n]) => ({ name, arguments: { n } }));
  const { model } = scripted([{ tool_calls: calls }, 'done']);
  const events = [];
  const result = await runLoop({
    model, tools: [fetch_, write], messages: [{ role: 'user', content: 'go' }], onEvent: (e) => events.push(e),
  });
  assert.equal(result.stopReason, 'answered', JSON.stringify(result.outcome));
  assert.equal(peak, 3, log.join());
  // The three fetches overlap; the write starts once they ended, the last fetch after it.
  assert.deepEqual(log.slice(0, 3).sort(), ['start fetch1', 'start fetch2', 'start fetch3']);
  assert.deepEqual(log.slice(5), ['end fetch1', 'start write4', 'end write4', 'start fetch5', 'end fetch5']);
  const results = result.messages.filter((m) => m.role === 'tool');
  assert.deepEqual(results.map((m) => JSON.parse(m.content).data), ['fetch1', 'fetch2', 'fetch3', 'write4', 'fetch5']);
  assert.deepEqual(result.toolCalls.map((c) => c.status), ['ok', 'ok', 'ok', 'ok', 'ok']);
  assert.equal(events.filter((e) => e.type === 'tool_started').length, 5);
  assert.equal(events.filter((e) => e.type === 'tool_finished').length, 5);

  // At most maxParallel at once.
  log.length = 0;
  peak = 0;
  const four = scripted([{ tool_calls: [1, 2, 3, 4].map((n) => ({ name: 'fetch', arguments: { n } })) }, 'done']);
  const r2 = await runLoop({ model: four.model, tools: [fetch_], messages: [{ role: 'user', content: 'go' }], limits: { maxParallel: 2 } });
  assert.equal(r2.stopReason, 'answered', JSON.stringify(r2.outcome));
  assert.equal(peak, 2, log.join());
  assert.equal(r2.toolCalls.length, 4);
});

test('a run stopped while parallel calls are under way gives each call exactly one result', async () => {
  const started = [];
  const slow = {
    name: 'slow', description: 'Never ends.', parallelSafe: true, parameters: { type: 'object', properties: { n: { type: 'integer' } } },
    run: ({ n }) => { started.push(n); return new Promise(() => {}); }, // ignores its signal
  };
  const quick = { ...slow, name: 'quick', run: ({ n }) => { started.push(n); return 'quick'; } };
  const { model } = scripted([{ tool_calls: [{ name: 'slow', arguments: { n: 1 } }, { name: 'quick', arguments: { n: 2 } }, { name: 'slow', arguments: { n: 3 } }] }, 'done']);
  const result = await runLoop({ model, tools: [slow, quick], messages: [{ role: 'user', content: 'go' }], limits: { timeoutMs: 200 } });
  assert.equal(result.stopReason, 'timeout', JSON.stringify(result.outcome));
  assert.deepEqual(started.sort(), [1, 2, 3], 'all three started at once');
  const calls = result.messages.find((m) => m.role === 'assistant').tool_calls.map((c) => c.id);
  const results = result.messages.filter((m) => m.role === 'tool').map((m) => m.call_id);
  assert.deepEqual(results, calls, JSON.stringify(result.messages));
});
