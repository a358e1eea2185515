// The engine's cost per round in Node: a loop of N rounds against an instant in-process model
// (one tool call per round, then the answer) and an instant tool; the median of REPS runs.
// Both the wall time and the process's CPU time are given: on a loaded machine the CPU time
// is the steadier figure.
// Usage: node round-cost.mjs [rounds=50] [reps=21] [package=../npm]
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

const rounds = Number(process.argv[2] ?? 50);
const reps = Number(process.argv[3] ?? 21);
const pkg = resolve(import.meta.dirname, process.argv[4] ?? '../npm');
const { runLoop } = await import(pathToFileURL(`${pkg}/node.js`).href);
const tool = { name: 'echo', description: 'Echoes.', parameters: { type: 'object', properties: { n: { type: 'integer' } } }, run: ({ n }) => n };

async function once(n) {
  let calls = 0;
  const model = {
    nativeTools: true,
    complete: () => (++calls < n ? { tool_calls: [{ name: 'echo', arguments: { n: calls } }] } : 'done'),
  };
  const t = process.hrtime.bigint();
  const c = process.cpuUsage();
  const r = await runLoop({ model, tools: [tool], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: n, maxToolCalls: n } });
  const cpu = process.cpuUsage(c);
  const ns = Number(process.hrtime.bigint() - t);
  if (r.stopReason !== 'answered' || r.outcome.rounds !== n) throw new Error(JSON.stringify(r.outcome));
  return { wall: ns / 1000, cpu: cpu.user + cpu.system };
}

const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];
await once(rounds); // warm-up
const small = [], big = [];
for (let i = 0; i < reps; i++) { small.push(await once(2)); big.push(await once(rounds)); }
const per = (k) => (median(big.map((x) => x[k])) - median(small.map((x) => x[k]))) / (rounds - 2);
const total = (k) => (median(big.map((x) => x[k])) / 1000).toFixed(2);
console.log(`${rounds} rounds: ${total('wall')} ms wall, ${total('cpu')} ms CPU; per extra round ${per('wall').toFixed(1)} µs wall, ${per('cpu').toFixed(1)} µs CPU (median of ${reps})`);
