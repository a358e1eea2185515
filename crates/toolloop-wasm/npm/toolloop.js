// toolloop in JavaScript: runLoop() over the WebAssembly engine (browser build: call init() or
// let runLoop load the module next to this file). Node imports `node.js`, which loads it itself.
import initWeb, * as web from './pkg/web/toolloop_wasm.js';

let ready = null;

/** Loads the WebAssembly module (once); `input` is what wasm-bindgen's init takes. */
export function init(input) {
  ready ??= initWeb(input ? { module_or_path: input } : undefined).then(() => web);
  return ready;
}

export async function runLoop(options) {
  return runWith(await init(), options);
}

export async function* streamLoop(options) {
  yield* streamWith(await init(), options);
}

/** The loop with an engine already loaded (`engine.run`); shared by both builds. */
export async function runWith(engine, options) {
  const { model, tools = [], messages = [], limits, onEvent, signal, state, checkpoints, context, approvals, approve, reminders, stopWhen, onRoundLimit } = options;
  const byName = new Map(tools.map((t) => [t.name, t]));
  const spec = {
    model: modelSpec(model),
    tools: tools.map(({ name, description = '', parameters = { type: 'object' }, needsApproval, parallelSafe, approvalSubject }) => {
      const decl = { name, description, parameters };
      if (needsApproval) decl.needsApproval = true;
      if (parallelSafe) decl.parallelSafe = true;
      if (typeof approvalSubject === 'function') decl.approvalSubject = true;
      return decl;
    }),
    messages: messages.map(toMessage),
  };
  if (limits) spec.limits = limits;
  if (state) spec.state = typeof state === 'string' ? JSON.parse(state) : state;
  if (checkpoints) spec.checkpoints = true;
  if (context) spec.context = context;
  if (approvals) spec.approvals = approvals;
  // The run's own signal: it aborts when the caller's does (`cancelled`) or when the run's
  // time limit passes (`timeout`). Tools, `fetch` and the model get it; what the engine awaits
  // is cut short by it even when the awaited code ignores it.
  const stop = new AbortController();
  let why = null;
  const halt = (reason) => { if (!stop.signal.aborted) { why = reason; stop.abort(new Error(`the run was stopped: ${reason}`)); } };
  const onCancel = () => halt('cancelled');
  if (signal?.aborted) halt('cancelled');
  else signal?.addEventListener('abort', onCancel, { once: true });
  const deadline = limits?.timeoutMs == null ? null : setTimeout(() => halt('timeout'), limits.timeoutMs);
  const stopped = new Promise((_, reject) => {
    const fail = () => reject(stop.signal.reason);
    if (stop.signal.aborted) fail(); else stop.signal.addEventListener('abort', fail, { once: true });
  });
  stopped.catch(() => {});
  const guarded = (work) => Promise.race([work, stopped]);
  // What the model was sent so far (the engine sends only what differs).
  const held = { messages: [], tools: [], settings: {} };
  const host = {
    aborted: () => (stop.signal.aborted ? why : false),
    // The backoff before a failed call is made again; cut short by the run's signal.
    sleep: (ms) => new Promise((resolve) => {
      if (stop.signal.aborted) return resolve();
      const done = () => { clearTimeout(timer); stop.signal.removeEventListener('abort', done); resolve(); };
      const timer = setTimeout(done, ms);
      stop.signal.addEventListener('abort', done, { once: true });
    }),
    async http(url, headers, body) {
      const f = model.fetch ?? globalThis.fetch;
      const res = await guarded(f(url, { method: 'POST', headers, body, signal: stop.signal }));
      const head = {};
      res.headers.forEach((v, k) => { head[k] = v; });
      const reader = res.body ? res.body.getReader() : null;
      return {
        status: res.status,
        headers: head,
        async read() {
          if (!reader) return undefined;
          const { value, done } = await guarded(reader.read());
          return done ? undefined : value;
        },
      };
    },
    // The engine sends what changed since its last request (see `held` in the crate's
    // driver): the conversation is kept here, and the model gets a copy of it each call.
    async complete(request) {
      const r = JSON.parse(request);
      let request_ = null;
      if (r.summary) {
        request_ = { messages: r.messages, reminders: r.reminders, tools: [], settings: r.settings ?? {} };
      } else {
        if (r.from > held.messages.length) throw new Error('the model\'s conversation is out of step with the engine');
        held.messages.length = r.from;
        for (const m of r.messages) held.messages.push(m);
        if (r.tools) held.tools = r.tools;
        if (r.settings) held.settings = r.settings;
        request_ = { messages: held.messages.slice(), reminders: r.reminders, tools: held.tools, settings: held.settings };
      }
      const answer = await guarded(model.complete(request_, { signal: stop.signal }));
      return JSON.stringify(toResponse(answer));
    },
    // One attempt of a tool call: its own signal (aborted when the run stops or the attempt
    // passes the tool's time limit, which fails it with a retryable error, as natively).
    async tool(name, args, callId, attempt, timeoutMs) {
      const tool = byName.get(name);
      if (!tool) return JSON.stringify({ error: `no tool named ${name}` });
      const own = new AbortController();
      const onStop = () => own.abort(stop.signal.reason);
      stop.signal.addEventListener('abort', onStop, { once: true });
      let timer;
      const racers = [stopped];
      if (timeoutMs != null) {
        racers.push(new Promise((resolve) => {
          timer = setTimeout(() => {
            own.abort(new Error('the tool\'s time limit passed'));
            resolve({ error: `the tool did not finish within ${(timeoutMs / 1000).toFixed(1)}s`, retryable: true });
          }, timeoutMs);
        }));
      }
      const running = Promise.resolve()
        .then(() => tool.run(JSON.parse(args), { signal: own.signal, callId, attempt }))
        .then(
          (value) => ({ ok: value === undefined ? null : value }),
          (e) => ({ error: String(e?.message ?? e), retryable: e?.retryable === true }),
        );
      try {
        return JSON.stringify(await Promise.race([running, ...racers]));
      } finally {
        clearTimeout(timer);
        stop.signal.removeEventListener('abort', onStop);
      }
    },
  };
  // A call's approval subject, as its tool's `approvalSubject` gives it (what approval rules'
  // subject globs match); the engine asks only for tools that have one.
  host.subject = (name, args) => {
    const subject = byName.get(name)?.approvalSubject?.(JSON.parse(args));
    if (typeof subject !== 'string') throw new TypeError(`approvalSubject of ${name} gave ${typeof subject}, not a string`);
    return subject;
  };
  if (typeof approve === 'function') {
    host.approve = async (pending) => JSON.stringify(toAnswer(await guarded(approve(JSON.parse(pending), { signal: stop.signal }))));
  }
  // Hooks, asked by the engine as natively: strings for the next round's request only, and a
  // signal (text) that ends the run after a round's calls.
  if (typeof reminders === 'function') {
    host.reminders = async (view) => {
      const list = await guarded(Promise.resolve(reminders(JSON.parse(view))));
      return JSON.stringify(Array.isArray(list) ? list.filter((r) => typeof r === 'string') : []);
    };
  }
  if (typeof stopWhen === 'function') {
    host.stopWhen = async (calls) => {
      const signal_ = await guarded(Promise.resolve(stopWhen(JSON.parse(calls))));
      return JSON.stringify(typeof signal_ === 'string' && signal_ ? signal_ : null);
    };
  }
  if (typeof onRoundLimit === 'function') {
    host.onRoundLimit = async (view) => JSON.stringify(toRoundLimit(await guarded(Promise.resolve(onRoundLimit(JSON.parse(view))))));
  }
  if (onEvent) host.event = (json) => onEvent(JSON.parse(json));
  try {
    return JSON.parse(await engine.run(JSON.stringify(spec), host));
  } finally {
    clearTimeout(deadline);
    signal?.removeEventListener('abort', onCancel);
  }
}

/** An `approve` callback's answer as the engine's: `true`, or `{ approved, reason }`. */
function toAnswer(a) {
  if (a === true || a?.approved === true) return { answer: 'approve' };
  const reason = typeof a?.reason === 'string' ? a.reason : undefined;
  return reason === undefined ? { answer: 'deny' } : { answer: 'deny', reason };
}

/** An `onRoundLimit` answer as the engine's decision: `{ extend: n }` (n a positive whole
 * number) grants n more rounds, `{ signal: text }` ends the run with `terminal_signal`; any
 * other answer stops it with `max_rounds`. */
function toRoundLimit(a) {
  const n = a?.extend;
  if (Number.isInteger(n) && n > 0) return { extend: Math.min(n, 0xffffffff) };
  if (typeof a?.signal === 'string' && a.signal) return { signal: a.signal };
  return 'stop';
}

/** The run's events as an async iterator; the last item is `{ type: 'result', result }`. */
export async function* streamWith(engine, options) {
  const queue = [];
  let wake = null;
  let finished = false;
  const push = (item) => { queue.push(item); wake?.(); wake = null; };
  const running = runWith(engine, {
    ...options,
    onEvent: (e) => { options.onEvent?.(e); push(e); },
  }).then(
    (result) => push({ type: 'result', result }),
    (error) => push({ type: 'error', error }),
  ).finally(() => { finished = true; wake?.(); });
  for (;;) {
    while (queue.length) {
      const item = queue.shift();
      if (item.type === 'error') throw item.error;
      yield item;
      if (item.type === 'result') { await running; return; }
    }
    if (finished && !queue.length) return;
    await new Promise((r) => { wake = r; });
  }
}

let callCount = 0;

/** A `complete` model's answer as toolloop's response (text, or its fields). */
function toResponse(answer) {
  const a = typeof answer === 'string' ? { text: answer } : { ...answer };
  const calls = (a.tool_calls ?? a.toolCalls ?? []).map((c) => ({
    id: c.id ?? `call_js_${++callCount}`,
    name: c.name,
    arguments: typeof c.arguments === 'string' ? JSON.parse(c.arguments) : (c.arguments ?? {}),
  }));
  return {
    text: a.text ?? null,
    tool_calls: calls,
    finish_reason: a.finish_reason ?? (calls.length ? 'tool_calls' : 'stop'),
    usage: a.usage ?? null,
    parts: a.parts ?? [],
  };
}

/** Whether an item of `streamLoop` is its last, the result. */
export function isResult(item) {
  return item?.type === 'result' && 'result' in item;
}

function modelSpec(model) {
  if (!model) throw new TypeError('runLoop: `model` is required');
  if (typeof model.complete === 'function') {
    return { provider: 'host', prompted: model.prompted ?? (model.nativeTools ? undefined : 'ptk'), stream: false };
  }
  const { provider, model: name, baseUrl, apiKey, stream = false, prompted } = model;
  return { provider, model: name, baseUrl, apiKey, stream, prompted };
}

/** `{ role, content }` (what most JavaScript code holds) as toolloop's message. */
function toMessage(m) {
  if (m.role === 'user' || m.role === 'system') return { role: m.role, content: m.content };
  return m;
}
