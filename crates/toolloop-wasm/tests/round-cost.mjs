// The engine's cost per round in Node: a loop of N rounds against an instant in-process model
// (one tool call per round, then the answer) and an instant tool; the median of REPS runs.
// Usage: node round-cost.mjs [rounds=50] [reps=21]
import { runLoop } from '../npm/node.js';

const rounds = Number(process.argv[2] ?? 50);
const reps = Number(process.argv[3] ?? 21);
const tool = { name: 'echo', description: 'Echoes.', parameters: { type: 'object', properties: { n: { type: 'integer' } } }, run: ({ n }) => n };

async function once(n) {
  let calls = 0;
  const model = {
    nativeTools: true,
    complete: () => (++calls < n ? { tool_calls: [{ name: 'echo', arguments: { n: calls } }] } : 'done'),
  };
  const t = process.hrtime.bigint();
  const r = await runLoop({ model, tools: [tool], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: n, maxToolCalls: n } });
  const ns = Number(process.hrtime.bigint() - t);
  if (r.stopReason !== 'answered' || r.outcome.rounds !== n) throw new Error(JSON.stringify(r.outcome));
  return ns;
}

const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];
await once(rounds); // warm-up
const small = [], big = [];
for (let i = 0; i < reps; i++) { small.push(await once(2)); big.push(await once(rounds)); }
const perRound = (median(big) - median(small)) / (rounds - 2) / 1000;
console.log(`${rounds} rounds: ${(median(big) / 1e6).toFixed(2)} ms; per extra round ${perRound.toFixed(1)} µs (median of ${reps})`);
