// toolloop in Node (18 or later): the nodejs build of the WebAssembly engine, loaded at import.
import { createRequire } from 'node:module';
import { runWith, streamWith, isResult } from './toolloop.js';

const engine = createRequire(import.meta.url)('./pkg/node/toolloop_wasm.js');

export async function init() { return engine; }
export function runLoop(options) { return runWith(engine, options); }
export function streamLoop(options) { return streamWith(engine, options); }
export { runWith, streamWith, isResult };
