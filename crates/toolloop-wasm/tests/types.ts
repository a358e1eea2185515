// Checked by scripts/wasm-build with `tsc --strict`: the dozen lines that replace a hand-written
// loop type-check against the package's declarations.
import { runLoop, streamLoop, isResult, type Tool, type RunResult, type CompleteModel } from '../npm/toolloop.js';

const weather: Tool<{ city: string }> = {
  name: 'weather',
  description: 'The weather in a city.',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  run: async ({ city }, { signal }) => (signal?.aborted ? null : { city, sky: 'clear' }),
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
  for await (const item of streamLoop({ model: inPage, tools: [weather], state: result.state })) {
    if (isResult(item)) return String(item.result.text);
  }
  return result.stopReason === 'answered' ? (result.text ?? '') : result.stopReason;
}
