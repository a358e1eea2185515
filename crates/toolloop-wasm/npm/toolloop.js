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
  const { model, tools = [], messages = [], limits, onEvent, signal, state, checkpoints } = options;
  const byName = new Map(tools.map((t) => [t.name, t]));
  const spec = {
    model: modelSpec(model),
    tools: tools.map(({ name, description = '', parameters = { type: 'object' } }) => ({ name, description, parameters })),
    messages: messages.map(toMessage),
  };
  if (limits) spec.limits = limits;
  if (state) spec.state = typeof state === 'string' ? JSON.parse(state) : state;
  if (checkpoints) spec.checkpoints = true;
  const host = {
    aborted: () => Boolean(signal?.aborted),
    // The backoff before a failed model call is made again; cut short by the signal.
    sleep: (ms) => new Promise((resolve) => {
      if (signal?.aborted) return resolve();
      const done = () => { clearTimeout(timer); signal?.removeEventListener('abort', done); resolve(); };
      const timer = setTimeout(done, ms);
      signal?.addEventListener('abort', done, { once: true });
    }),
    async http(url, headers, body) {
      const f = model.fetch ?? globalThis.fetch;
      const res = await f(url, { method: 'POST', headers, body, signal });
      const head = {};
      res.headers.forEach((v, k) => { head[k] = v; });
      const reader = res.body ? res.body.getReader() : null;
      return {
        status: res.status,
        headers: head,
        async read() {
          if (!reader) return undefined;
          const { value, done } = await reader.read();
          return done ? undefined : value;
        },
      };
    },
    async complete(request) {
      const answer = await model.complete(JSON.parse(request), { signal });
      return JSON.stringify(toResponse(answer));
    },
    async tool(name, args, callId) {
      const tool = byName.get(name);
      if (!tool) return JSON.stringify({ error: `no tool named ${name}` });
      try {
        const value = await tool.run(JSON.parse(args), { signal, callId });
        return JSON.stringify({ ok: value === undefined ? null : value });
      } catch (e) {
        return JSON.stringify({ error: String(e?.message ?? e) });
      }
    },
  };
  if (onEvent) host.event = (json) => onEvent(JSON.parse(json));
  const out = JSON.parse(await engine.run(JSON.stringify(spec), host));
  return out;
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
