// The engine's cost per round in Node: a loop of N rounds against an instant in-process model
// (one tool call per round, then the answer) and an instant tool. Each rep runs a loop of N
// rounds and one of 2; the cost per extra round is the difference of their medians over N - 2.
// Both the wall time and the process's CPU time are given: on a loaded machine the CPU time
// is the steadier figure.
//
// The runs are measured once the engine is warm: V8 first runs WebAssembly with its baseline
// compiler (Liftoff) and compiles the functions that turn out hot again with its optimising one
// (TurboFan) on background threads, whose CPU time is the process's; JavaScript is tiered up
// the same way. That takes some thousands of rounds in all: measured before, a loop of 50
// rounds seemed to cost several times one of 10 (the 50-round runs were the ones under way
// while the compiler worked), and the figures followed how many rounds had run before, not
// how long the conversation was. `warm` rounds (loops of N and 2 rounds) are run first.
//
// On a loaded machine a run the scheduler takes the core from (an involuntary context switch)
// costs more CPU time too (it resumes with caches the other processes filled): a loop of 10
// rounds mostly runs within one time slice, one of 50 mostly does not. The cost per round is
// also given from the runs no switch interrupted, when there are some of both lengths.
//
// Usage: node round-cost.mjs [rounds=50] [reps=31] [package=../npm] [warm=5000]
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

const rounds = Number(process.argv[2] ?? 50);
const reps = Number(process.argv[3] ?? 31);
const pkg = resolve(import.meta.dirname, process.argv[4] ?? '../npm');
const warm = Number(process.argv[5] ?? 5000);
if (!(rounds > 2) || !(reps >= 1) || !(warm >= 0)) {
  console.error('usage: node round-cost.mjs [rounds > 2] [reps >= 1] [package] [warm rounds >= 0]');
  process.exit(2);
}
const { runLoop } = await import(pathToFileURL(`${pkg}/node.js`).href);
const tool = { name: 'echo', description: 'Echoes.', parameters: { type: 'object', properties: { n: { type: 'integer' } } }, run: ({ n }) => n };

// Each round's wall time inside a run too (from one model call to the next), to compare a
// round early in the conversation with one late in it.
async function once(n, marks = null) {
  let calls = 0;
  const model = {
    nativeTools: true,
    complete: () => {
      marks?.push(process.hrtime.bigint());
      return ++calls < n ? { tool_calls: [{ name: 'echo', arguments: { n: calls } }] } : 'done';
    },
  };
  const switches = process.resourceUsage().involuntaryContextSwitches;
  const t = process.hrtime.bigint();
  const c = process.cpuUsage();
  const r = await runLoop({ model, tools: [tool], messages: [{ role: 'user', content: 'go' }], limits: { maxRounds: n, maxToolCalls: n } });
  const cpu = process.cpuUsage(c);
  const ns = Number(process.hrtime.bigint() - t);
  if (r.stopReason !== 'answered' || r.outcome.rounds !== n) throw new Error(JSON.stringify(r.outcome));
  return { wall: ns / 1000, cpu: cpu.user + cpu.system, switched: process.resourceUsage().involuntaryContextSwitches > switches };
}

const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];
for (let done = 0; done < warm || done === 0; done += rounds + 2) { await once(rounds); await once(2); }
const small = [], big = [], early = [], late = [];
for (let i = 0; i < reps; i++) {
  small.push(await once(2));
  const marks = [];
  big.push(await once(rounds, marks));
  const round = (k) => Number(marks[k] - marks[k - 1]) / 1000;
  for (let k = 2; k <= 6; k++) early.push(round(k));
  for (let k = rounds - 5; k < rounds; k++) late.push(round(k));
}
const per = (k) => (median(big.map((x) => x[k])) - median(small.map((x) => x[k]))) / (rounds - 2);
const total = (k) => (median(big.map((x) => x[k])) / 1000).toFixed(2);
console.log(`${rounds} rounds: ${total('wall')} ms wall, ${total('cpu')} ms CPU; per extra round ${per('wall').toFixed(1)} µs wall, ${per('cpu').toFixed(1)} µs CPU (median of ${reps}, after ${warm} rounds of warm-up)`);
const [whole, whole2] = [small, big].map((xs) => xs.filter((x) => !x.switched));
if (whole.length && whole2.length) {
  const cpu = (median(whole2.map((x) => x.cpu)) - median(whole.map((x) => x.cpu))) / (rounds - 2);
  console.log(`runs no context switch interrupted (${whole.length} of 2 rounds, ${whole2.length} of ${rounds}): per extra round ${cpu.toFixed(1)} µs CPU`);
} else {
  console.log(`every run of ${whole.length ? rounds : 2} rounds was interrupted by a context switch`);
}
console.log(`inside a run: rounds 2-6 ${median(early).toFixed(1)} µs wall each, rounds ${rounds - 5}-${rounds - 1} ${median(late).toFixed(1)} µs (medians)`);
