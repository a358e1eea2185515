// Types of the toolloop npm package (checked with `tsc --strict` by scripts/wasm-build).

/** A message of the conversation (toolloop's message model). */
export type Message =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; text?: string | null; tool_calls?: ToolCall[]; [k: string]: unknown }
  | { role: 'tool'; call_id: string; name: string; content: string; is_error?: boolean; [k: string]: unknown };

export interface ToolCall { id: string; name: string; arguments: unknown; [k: string]: unknown }

/** A tool: `run` gets the (validated) arguments, and the run's AbortSignal. */
export interface Tool<A = any> {
  name: string;
  description?: string;
  /** The JSON Schema of the arguments. */
  parameters?: Record<string, unknown>;
  run(args: A, context: { signal?: AbortSignal; callId: string }): unknown | Promise<unknown>;
}

export type Provider = 'openai' | 'openai-responses' | 'anthropic' | 'gemini';
export type Dialect = 'ptk' | 'hermes' | 'mistral' | 'llama3' | 'pythonic' | 'react' | (string & {});

/** A model behind one of the four wire APIs, called with `fetch`. */
export interface Endpoint {
  provider: Provider;
  model: string;
  baseUrl?: string;
  apiKey?: string;
  stream?: boolean;
  /** Prompt-based tool calling in this dialect (a model without native tools). */
  prompted?: Dialect;
  /** The fetch to use (the global one by default). */
  fetch?: typeof fetch;
}

/** What a `complete` model is asked. */
export interface ModelRequest {
  messages: Message[];
  reminders: string[];
  tools: { name: string; description: string; parameters: unknown }[];
  settings: Record<string, unknown>;
}

/** What a `complete` model answers: text, or toolloop's response (`text`, `tool_calls`, `usage`…). */
export type ModelAnswer = string | { text?: string | null; tool_calls?: ToolCall[]; [k: string]: unknown };

/** Any model: WebLLM's engine behind an adapter, an in-page model, a server of your own. */
export interface CompleteModel {
  complete(request: ModelRequest, context: { signal?: AbortSignal }): ModelAnswer | Promise<ModelAnswer>;
  /** Whether `complete` returns `tool_calls` itself; otherwise calls are taught and parsed (PTK). */
  nativeTools?: boolean;
  /** The dialect taught without native tools (default `ptk`). */
  prompted?: Dialect;
}

export interface Limits {
  maxRounds?: number;
  maxToolCalls?: number;
  detectDuplicates?: boolean;
  maxResultChars?: number;
  /**
   * Retries of a model call that failed with a retryable error (network failure, 429, 5xx)
   * before it delivered output, after a backoff (the server's `retry-after`, else 0.5 s
   * doubling, with jitter); default 2. Each retry is announced by a `model_retry` event.
   */
  modelRetries?: number;
}

export type StopReason =
  | 'answered' | 'max_rounds' | 'max_tool_calls' | 'timeout' | 'cancelled' | 'terminal_signal'
  | 'too_many_invalid_calls' | 'output_truncated' | 'model_error' | 'empty_answer'
  | 'store_failed' | 'awaiting_approval' | 'context_exhausted';

/** An event of the run (`type` says which; `checkpoint` carries the state to save). */
export interface RunEvent { type: string; [k: string]: unknown }

/** The saved state of a run (JSON; keep it in IndexedDB or a database). */
export type RunState = Record<string, unknown>;

export interface RunOptions {
  model: Endpoint | CompleteModel;
  tools?: Tool[];
  messages?: Message[];
  limits?: Limits;
  onEvent?: (event: RunEvent) => void;
  signal?: AbortSignal;
  /** Go on from a saved state (a result's `state`, or a `checkpoint` event's). */
  state?: RunState | string;
  /** Emit a `checkpoint` event with the state after each model call and each round's tools. */
  checkpoints?: boolean;
}

export interface ExecutedCall { round: number; call: ToolCall; status: string; content: string; duration_ms: number; attempts: number; [k: string]: unknown }
export interface Usage { input_tokens: number; output_tokens: number; [k: string]: unknown }

export interface RunResult {
  text: string | null;
  stopReason: StopReason;
  toolCalls: ExecutedCall[];
  messages: Message[];
  usage: Usage | null;
  /** toolloop's whole outcome (success, rounds, error, …). */
  outcome: Record<string, unknown>;
  state: RunState;
}

export type StreamItem = RunEvent | { type: 'result'; result: RunResult };

/** Whether an item of `streamLoop` is its last, the result. */
export function isResult(item: StreamItem): item is { type: 'result'; result: RunResult };

export function init(input?: unknown): Promise<unknown>;
export function runLoop(options: RunOptions): Promise<RunResult>;
export function streamLoop(options: RunOptions): AsyncGenerator<StreamItem, void, unknown>;
