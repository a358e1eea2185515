// Checked by scripts/wasm-build with `tsc --strict`: the dozen lines that replace a hand-written
// loop type-check against the package's declarations.
import { runLoop, streamLoop, isResult, type Tool, type RunResult, type CompleteModel, type ToolError } from '../npm/toolloop.js';

const weather: Tool<{ city: string }> = {
  name: 'weather',
  description: 'The weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  parallelSafe: true,
  run: async ({ city }, { signal }) => (signal?.aborted ? null : { city, sky: 'clear' }),
};

const remove: Tool<{ path: string }> = {
  name: 'remove',
  parameters: { type: 'object', properties: { path: { type: 'string' } } },
  needsApproval: true,
  run: async ({ path }, { signal, attempt }) => {
    if (attempt < 2) throw Object.assign(new Error('busy'), { retryable: true }) as ToolError;
    return signal.aborted ? null : `removed ${path}`;
  },
};

const shell: Tool<{ command: string }> = {
  name: 'shell',
  parameters: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'] },
  approvalSubject: ({ command }) => command,
  run: async ({ command }) => `ran ${command}`,
};

const inPage: CompleteModel = { complete: async (request) => `I saw ${request.messages.length} messages` };

export async function demo(signal: AbortSignal): Promise<string> {
  const result: RunResult = await runLoop({
    model: { provider: 'openai', model: 'gpt-4o-mini', apiKey: 'sk-…', stream: true },
    tools: [weather],
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    limits: { maxRounds: 5 },
    onEvent: (e) => console.log(e.type),
    signal,
  });
  for await (const item of streamLoop({
    model: inPage,
    tools: [weather, remove, shell],
    approvals: { rules: [{ action: 'allow', tool: 'shell', subject: 'git status*' }, { action: 'deny', tool: 'shell', subject: 'rm *' }], default: 'ask' },
    state: result.state,
    limits: { timeoutMs: 60_000, toolTimeoutMs: 5_000, toolRetries: 1, toolRetryBackoffMs: 100, maxParallel: 4 },
    context: { window: 8192, keepRounds: 4, spillOver: null },
    approve: async ({ call }) => (call.name === 'remove' ? { approved: false, reason: 'not now' } : true),
    reminders: ({ round }) => [`This is round ${round}.`],
    onRoundLimit: ({ round, toolCalls }) => (toolCalls > 20 ? { signal: 'too many calls' } : round < 20 ? { extend: 5 } : 'stop'),
    stopWhen: (calls) => (calls.some((c) => c.result !== null && 'error' in c.result) ? 'a call failed' : null),
  })) {
    if (isResult(item)) return String(item.result.text);
  }
  return result.stopReason === 'answered' ? (result.text ?? '') : result.stopReason;
}
