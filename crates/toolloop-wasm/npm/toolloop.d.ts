// Types of the toolloop npm package (checked with `tsc --strict` by scripts/wasm-build).

/** A message of the conversation (toolloop's message model). */
export type Message =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; text?: string | null; tool_calls?: ToolCall[]; [k: string]: unknown }
  | { role: 'tool'; call_id: string; name: string; content: string; is_error?: boolean; [k: string]: unknown };

export interface ToolCall { id: string; name: string; arguments: unknown; [k: string]: unknown }

/**
 * A tool: `run` gets the (validated) arguments and the attempt's context. An error it throws is
 * the call's result, which the model reads; one with `retryable: true` (see `ToolError`) is
 * first made again, up to `limits.toolRetries` times.
 */
export interface Tool<A = any> {
  name: string;
  description?: string;
  /** The JSON Schema of the arguments. */
  parameters?: Record<string, unknown>;
  /** Each call waits for `RunOptions.approve` (a person's decision) before it runs. */
  needsApproval?: boolean;
  /**
   * Calls of this tool may run at the same time as the round's other parallel-safe calls
   * (at most `limits.maxParallel` at once); other calls run one after another, in order.
   */
  parallelSafe?: boolean;
  /**
   * What a call is about, for approval rules' `subject` globs and for the person asked (a
   * command line, a path); called at once, with the call's arguments. Without it a call's
   * subject is its canonical JSON arguments. When it throws (or gives no string) the subject
   * is uncertain, and every `deny` and `ask` rule of the tool matches the call.
   */
  approvalSubject?(args: A): string;
  run(args: A, context: ToolContext): unknown | Promise<unknown>;
}

export interface ToolContext {
  /**
   * Aborted when the run is cancelled or its time is up, and when this attempt passes
   * `limits.toolTimeoutMs`. The run goes on without waiting for a tool that ignores it.
   */
  signal: AbortSignal;
  callId: string;
  /** The attempt (1-based). */
  attempt: number;
}

/** An error a tool throws; `retryable: true` has the call made again (`limits.toolRetries`). */
export interface ToolError extends Error { retryable?: boolean }

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

/**
 * What a `complete` model is asked: the whole conversation, each call (the engine sends the
 * package only what changed since the last call; `messages` is a fresh array each time, its
 * messages shared with earlier calls: read them, do not change them).
 */
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
  /**
   * The run's wall-clock limit in milliseconds: past it the run stops with `timeout`, cutting
   * short the model call or tool under way (whose signal is aborted).
   */
  timeoutMs?: number;
  /**
   * The limit of one attempt of a tool call in milliseconds: past it the attempt's signal is
   * aborted and it fails with a retryable error ("the tool did not finish within …").
   */
  toolTimeoutMs?: number;
  /** Retries of a tool call whose attempt failed with a retryable error (default 2). */
  toolRetries?: number;
  /** The most parallel-safe calls of a round running at once (default 10). */
  maxParallel?: number;
  /** The first wait before a tool call is made again, in milliseconds; doubles each time (default 200). */
  toolRetryBackoffMs?: number;
}

/**
 * What the run does to stay inside the model's context window (toolloop's `ContextPolicy`,
 * applied by the engine): long results are spilled (the model gets a preview and reads the
 * rest with a `read_result` tool the engine offers and answers), old rounds' results are
 * cleared, and past `compactAt` of `window` the older part of the conversation is summarised
 * by the run's model (a `complete` model is then asked with no tools, the part to summarise in
 * its messages). Each field is optional (toolloop's defaults otherwise).
 */
export interface ContextOptions {
  /**
   * The model's context window in tokens (default: the window toolloop knows for the
   * endpoint's model name); no compaction is started by the estimate without one.
   */
  window?: number;
  /** Compact when the estimated next request passes this share of the window (default 0.8). */
  compactAt?: number;
  /** Keep the results of this many most recent rounds whole (default 8; 0: never clear). */
  keepRounds?: number;
  /** Spill a result longer than this many bytes (default 16384; `null`: never). */
  spillOver?: number | null;
  /** Bytes of a spilled result shown at its head and at its tail (default 1024). */
  spillPreview?: number;
  /** Whether to compact at all (default true). */
  compact?: boolean;
}

/** A call that waits for a person's approval, as `approve` is given it. */
export interface PendingApproval {
  round: number;
  index: number;
  /** The call, exactly as it would run. */
  call: ToolCall;
  /**
   * What the decision is about: the tool's `approvalSubject`, else the call's canonical
   * arguments; an object when the subject is uncertain (`uncertain` says why).
   */
  subject: string | { text: string; uncertain?: string; aliases?: string[]; person?: boolean };
  [k: string]: unknown;
}

/**
 * One approval rule: `tool` is a glob over the tool's name, `subject` (when given) one over the
 * call's approval subject. Globs: `*` any run of characters (`/` and spaces included), `?` one
 * character, `[abc]` a class, `{a,b}` alternatives, `\` escapes. `allow` rules match the subject
 * case-sensitively, `deny` and `ask` rules ignoring case.
 */
export interface ApprovalRule { action: 'allow' | 'ask' | 'deny'; tool: string; subject?: string }

export interface ApprovalRules { rules?: ApprovalRule[]; default?: 'allow' | 'ask' | 'deny' }

/** `true` runs the call; `false` or `{ approved: false, reason }` denies it (the model reads why). */
export type ApprovalAnswer = boolean | { approved: boolean; reason?: string };

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
  /** The context policy (none by default: the conversation is sent whole). */
  context?: ContextOptions;
  /**
   * Approval rules, as toolloop's: which calls run on their own, which wait for `approve`,
   * which never run (the model reads `denied: …`). When several rules match a call, `deny`
   * wins over `ask`, and `ask` over `allow`; when none does, `default`, else the tool's own
   * (`ask` with `needsApproval`, `allow` otherwise). A rule whose glob does not compile
   * refuses the run, naming it.
   */
  approvals?: ApprovalRules;
  /**
   * Decides on each call of a tool marked `needsApproval`, before it runs. A handler that
   * throws denies. Without one, such a call waits and the run stops with `awaiting_approval`
   * (`outcome.pending_approvals`): resume its `state` with an `approve`.
   */
  approve?: (pending: PendingApproval, context: { signal: AbortSignal }) => ApprovalAnswer | Promise<ApprovalAnswer>;
  /**
   * Before each round: strings sent with that round's request only (after the conversation,
   * never kept in it). A hook that throws adds none.
   */
  reminders?: (view: LoopView) => string[] | Promise<string[]>;
  /**
   * After every call of a round ran: a signal (any text) ends the run with `terminal_signal`
   * (`outcome.signal`); `null` goes on. A hook that throws does not stop the run.
   */
  stopWhen?: (calls: RoundCall[]) => string | null | undefined | Promise<string | null | undefined>;
  /**
   * When `limits.maxRounds` is reached: `{ extend: n }` grants `n` more rounds (then it is
   * asked again at the new limit), `{ signal }` ends the run with `terminal_signal`
   * (`outcome.signal`), `'stop'` (or anything else) stops it with `max_rounds`, as without
   * the hook. A hook that throws stops the run.
   */
  onRoundLimit?: (view: LoopView) => RoundLimitAnswer | Promise<RoundLimitAnswer>;
}

/** What `onRoundLimit` decides. */
export type RoundLimitAnswer = { extend: number } | { signal: string } | 'stop' | null | undefined;

/**
 * The loop as the `reminders` and `onRoundLimit` hooks see it: the round about to start (for
 * `reminders`) or just run (for `onRoundLimit`), and what was spent.
 */
export interface LoopView {
  round: number;
  toolCalls: number;
  usage: Usage | null;
  lastCall: ExecutedCall | null;
}

/** A call of the round and its result (`null`: it did not run: invalid, duplicate, denied). */
export interface RoundCall {
  call: ToolCall;
  result: { ok: { message: string; data?: unknown; [k: string]: unknown } } | { error: string } | null;
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
