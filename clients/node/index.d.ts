// Type declarations of pg-idem (hand-written).
import type { ClientBase, Pool, PoolClient } from 'pg';

/** The scope of a record: tenant + endpoint + key, and how to claim it. */
export interface Scope {
  tenant: string;
  endpoint: string;
  key: string;
  /** bytes as they are; a string as text; anything else as canonical JSON */
  fingerprint?: Buffer | string | object | null;
  /** wait for another holder of the key: true (10 s) or milliseconds */
  wait?: boolean | number;
  /** the claim's lease: milliseconds or a PostgreSQL interval ('30 seconds') */
  lease?: number | string;
  /** the schema of the extension (CREATE EXTENSION idem SCHEMA ...); default: the search_path finds it */
  schema?: string | null;
  /**
   * idem.trace of the claim's transaction (stored on the record): a W3C
   * traceparent (its trace-id is taken) or any id up to 255 bytes
   */
  trace?: string | null;
  /** gets the claim's decision (see DecisionLogger) */
  logger?: DecisionLogger | null;
}

/** The fields of the log line of each decision. */
export interface Decision {
  idempotency_key: string;
  tenant: string;
  endpoint: string;
  /** claimed, replay, in_progress, mismatch, unknown or frozen */
  outcome: string;
  attempt: number | null;
  trace_id: string;
}

/**
 * Where decisions are logged: a function of the fields, or a logger with
 * `info` and `warn` called as `(fields, message)` (pino, fastify's
 * request.log, console); conflicts (in_progress, mismatch, unknown, frozen)
 * go to `warn`.
 */
export type DecisionLogger =
  | ((fields: Decision) => void)
  | { info(fields: Decision, message: string): void; warn?(fields: Decision, message: string): void };

export type Headers = Record<string, string | string[]>;

/** What a handler produces; `body` an object is stored as its JSON. */
export interface Response {
  status?: number;
  headers?: Headers;
  body?: Buffer | Uint8Array | string | object | null;
}

export interface Result {
  outcome: 'claimed' | 'replay';
  status: number;
  headers: Headers;
  /** the stored bytes (null: no body) */
  body: Buffer | null;
  replayed: boolean;
  attempt: number;
  /** claimed only: the result was recorded as a retryable failure (a 5xx) */
  retryable?: boolean;
}

/** in_progress, mismatch, unknown or frozen: nothing was executed. */
export class IdemError extends Error {
  readonly outcome: 'in_progress' | 'mismatch' | 'unknown' | 'frozen';
  readonly attempt: number | null;
  /** 409, 422 for a mismatch, 503 for frozen */
  readonly statusCode: number;
  /** frozen: the reason idem_freeze was given (or null) */
  readonly reason?: string | null;
  /** frozen: until when (null: until idem_thaw) */
  readonly until?: Date | null;
  /** frozen: seconds to wait (until `until`, else 60) */
  readonly retryAfter?: number;
}

export function withIdempotency(
  pool: Pool,
  scope: Scope,
  fn: (client: PoolClient) => Promise<Response> | Response,
): Promise<Result>;

/**
 * What `request.idem` / `req.idem` holds on a route where idem applies: a
 * client in the request's transaction, and the claim if the request has a key.
 */
export type IdemRequest = {
  /** the request's transaction: run the handler's writes here (null in external mode) */
  client: PoolClient | null;
  endpoint: string;
  /** idem.trace of the request's transaction: the traceparent's trace-id, else the request id */
  trace: string;
} & (
  | { outcome: 'claimed'; tenant: string; key: string; attempt: number; expiresAt: Date }
  /**
   * no key (not required): nothing is claimed nor stored; the transaction
   * commits before the answer is sent, unless its status is 500 or more or
   * the handler threw
   */
  | { outcome: 'none'; tenant: null; key: null; attempt: null; expiresAt: null }
);

export interface HttpOptions<Req = any> {
  /** a pg Pool, or a function of the request that picks one */
  pool: Pool | ((request: Req) => Pool);
  /** the tenant of a request with a key (from its credentials), or a constant */
  tenant: string | ((request: Req) => string | Promise<string>);
  /** a request without the key gets 400 (default false: it runs, and nothing is claimed) */
  required?: boolean;
  /** the key's header (default Idempotency-Key) */
  header?: string;
  /** wait for a concurrent duplicate instead of 409: true (10 s) or milliseconds */
  wait?: boolean | number;
  /** the claim's lease: milliseconds or a PostgreSQL interval */
  lease?: number | string;
  /** Retry-After of a 409 or a 503, in seconds (default 1) */
  retryAfter?: number;
  /** the methods that take a key (default POST, PATCH) */
  methods?: string[];
  /** the request's fingerprint; false: none; default method + path + canonical body */
  fingerprint?: false | null | ((request: Req) => Buffer | string | null);
  /** the schema of the extension (CREATE EXTENSION idem SCHEMA ...); default: the search_path finds it */
  schema?: string | null;
  /**
   * an answer that could not be stored (or a transaction that could not
   * commit: `err.code` its SQLSTATE), and in Express a handler that threw a
   * 5xx; default: logged with the key and the SQLSTATE (fastify
   * request.log.error, Express console.error)
   */
  onError?: (err: Error & { code?: string }, request: Req & { idem: IdemRequest }) => void;
}

/** The Express middleware's options: HttpOptions, and where its decisions and trace ids come from. */
export interface ExpressOptions extends HttpOptions {
  /**
   * the request's id, idem.trace where no valid traceparent header names
   * the trace; default req.id (set by an earlier middleware), else a new UUID
   */
  requestId?: (req: any) => string | Promise<string>;
  /** gets each decision (default none); fastify logs them to request.log instead */
  logger?: DecisionLogger | null;
}

/** fastify route option `config.idem`: false, or overrides for the route */
export interface RouteOptions {
  required?: boolean;
  wait?: boolean | number;
  lease?: number | string;
  /** the external-call pattern: the claim commits before the handler runs */
  external?: boolean;
}

/** The fastify plugin: app.register(fastify, options). */
export declare const fastify: {
  (app: any, options: HttpOptions, done: (err?: Error) => void): void;
};

/** The Express middleware, and the wrapper of its routes' handlers. */
export interface ExpressMiddleware {
  (req: any, res: any, next: (err?: unknown) => void): Promise<void>;
  /**
   * A route's handler, async or not: what it throws or rejects with is
   * answered as problem+json and recorded (Express 4 ignores the promise a
   * handler returns: without this, a rejection stops the process).
   */
  handler(fn: (req: any, res: any, next: (err?: unknown) => void) => unknown):
    (req: any, res: any, next: (err?: unknown) => void) => Promise<void>;
}

/** The Express middleware: mount it per route, after the body parser. */
export function express(options: ExpressOptions): ExpressMiddleware;

/** JSON with object keys sorted at every level. */
export function canonicalJson(value: unknown): string;
/** The default fingerprint: SHA-256 of method, path and canonical body. */
export function fingerprint(method: string, path: string, body: unknown): Buffer;
export const MAX_KEY_LENGTH: 255;


// The outbox

/** A message for idem_enqueue. */
export interface EnqueueOptions {
  tenant: string;
  topic: string;
  key: string;
  /** a Buffer (or Uint8Array) as bytea, a string as text, anything else as its JSON (jsonb) */
  payload: Buffer | Uint8Array | string | object | number | boolean | null;
  /** sent with the message: names to strings or arrays of strings */
  headers?: Headers | null;
  /** not due before this time */
  notBefore?: Date | string | null;
  /** due only once every earlier message of its (tenant, topic, orderingKey) is delivered or dead */
  orderingKey?: string | null;
  /** attempts before the message is dead (default idem.outbox_max_attempts) */
  maxAttempts?: number | null;
  /** false: a lease that runs out makes the message `unknown` instead of due again (default true) */
  redeliver?: boolean;
  /** the schema of the extension (CREATE EXTENSION idem SCHEMA ...); default: the search_path finds it */
  schema?: string | null;
}

/** What idem_enqueue answered. */
export interface Enqueued {
  /** duplicate: the key exists with the same payload; mismatch: with another; neither changes anything */
  outcome: 'enqueued' | 'duplicate' | 'mismatch';
  /** the message's id (a bigint, as a string) */
  id: string;
  state: 'queued' | 'leased' | 'delivered' | 'dead' | 'unknown';
  createdAt: Date;
}

/** Write an outbound message in the client's transaction: delivered only if it commits. */
export function enqueue(client: ClientBase, message: EnqueueOptions): Promise<Enqueued>;

/** A message as a handler gets it. */
export interface OutboxMessage {
  /** a bigint, as a string */
  id: string;
  tenant: string;
  topic: string;
  key: string;
  payload: Buffer;
  headers: Headers;
  /** 1 on the first take, one more on each: the fencing token of this lease */
  attempt: number;
  leaseExpiresAt: Date;
  /** `tenant/topic/key`, the same on every attempt: the receiver's idempotency key */
  idempotencyKey: string;
}

/** A handler's answer: nothing, or no status, is delivered. */
export interface DeliveryResult {
  /** 2xx delivered; 408, 429, 5xx retried; anything else dead */
  status?: number | null;
  /** stored with a delivered message */
  body?: Buffer | Uint8Array | string | object | null;
  /** seconds until a retry (default: idem's backoff) */
  retryAfter?: number | null;
}

interface DispatcherCommon {
  pool: Pool;
  topic: string;
  /** deliveries at once (default 4) */
  concurrency?: number;
  /** messages per take at most (default concurrency; never more than the free slots) */
  batchSize?: number;
  /** milliseconds a take leases a message for (default 30000) */
  lease?: number;
  /** milliseconds a delivery may take, shorter than the lease (default 10000) */
  timeout?: number;
  /** take only this tenant's messages (default every tenant's) */
  tenant?: string | null;
  /** milliseconds between takes without a notification (default 1000) */
  pollInterval?: number;
  /** milliseconds between calls of idem_purge(), where no background worker purges (the SQL edition); default none */
  purgeInterval?: number | null;
  /** default console */
  logger?: Logger;
  /** the schema of the extension (CREATE EXTENSION idem SCHEMA ...); default: the search_path finds it */
  schema?: string | null;
}

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export type DispatcherOptions = DispatcherCommon & (
  /** POST the payload there, with Idempotency-Key, the message's headers and Idem-Attempt */
  | { url: string | URL; handler?: never }
  | { handler: (message: OutboxMessage, context: { signal: AbortSignal }) =>
        Promise<DeliveryResult | void> | DeliveryResult | void; url?: never }
);

export interface Dispatcher {
  /** resolves once it LISTENs; a second call returns the same promise; rejects after stop() */
  start(): Promise<void>;
  /** resolves once the deliveries in flight are recorded and the LISTEN client is released */
  stop(): Promise<void>;
}

export function createDispatcher(options: DispatcherOptions): Dispatcher;


// Agent tools (MCP)

/** The options of registerIdempotentTool. */
export interface ToolOptions<Args = Record<string, unknown>> {
  pool: Pool;
  /** the tenant of a call: a constant, or a function of the tool's arguments (idempotency_key included) */
  tenant: string | ((args: Args & { idempotency_key: string }, extra: any) => string | Promise<string>);
  /**
   * the task whose budget each execution spends one unit of (idem_spend in
   * the claim's transaction); the application creates the budget first
   * with idem_budget(tenant, task, attempts).  Default: none, nothing spent
   */
  task?: string | null | ((args: Args & { idempotency_key: string }, extra: any) => string | Promise<string>);
  /** how long a call waits for a concurrent call of the same key: true (60 s, the default), milliseconds, or false */
  wait?: boolean | number;
  /** gets each decision (default none) */
  logger?: DecisionLogger | null;
  /** the schema of the extension; default: the search_path finds it */
  schema?: string | null;
  /** the application's zod (default: the `zod` package, in the version the tool's schemas use) */
  zod?: unknown;
}

/** What a tool's handler finds in `extra.idem`. */
export interface ToolIdem {
  /** the claim's transaction: writes here commit with the stored result, and roll back if the handler fails */
  client: PoolClient;
  tenant: string;
  /** `tool:<name>` */
  endpoint: string;
  key: string;
  /** 1, or more after failed attempts */
  attempt: number;
  expiresAt: Date;
  task: string | null;
  /** what the task's budget has left after this execution's unit (null without a task) */
  budgetLeft: number | null;
  /** idem.trace: the traceparent in the request's _meta, else a new id */
  trace: string;
}

/** The idempotency of a call, in every result's structuredContent. */
export interface ToolIdempotency {
  key: string;
  /** true: the stored result of an earlier call; the tool did not run */
  replayed: boolean;
  /**
   * on an isError result that did not come from the tool: in_progress,
   * mismatch, unknown, frozen, budget_exhausted, no_budget, or failed (the
   * handler threw)
   */
  outcome?: string;
}

/**
 * Register a side-effecting tool on an @modelcontextprotocol/sdk McpServer
 * (its registerTool) so that it runs once per idempotency key: a required
 * `idempotency_key` (1-255 characters) is added to `config.inputSchema` (a
 * zod raw shape or z.object); the handler gets the other arguments, and
 * `extra.idem`.  Every result has `structuredContent.idempotency` ({key,
 * replayed}; added to `config.outputSchema` where there is one) and a last
 * text line saying whether the tool ran now or the result was replayed.
 */
export function registerIdempotentTool<Args extends Record<string, unknown> = Record<string, any>>(
  server: { registerTool(name: string, config: any, cb: (...args: any[]) => any): any },
  options: ToolOptions<Args>,
  name: string,
  config: { inputSchema?: unknown; outputSchema?: unknown; [field: string]: unknown },
  handler: (args: Args, extra: { idem: ToolIdem; [field: string]: any }) => Promise<ToolResult> | ToolResult,
): any;

/** A CallToolResult, as a tool returns it. */
export interface ToolResult {
  content: Array<{ type: string; [field: string]: unknown }>;
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
  [field: string]: unknown;
}


// Calling another service

export interface IdempotentRequestOptions {
  /** default POST */
  method?: string;
  headers?: Record<string, string> | globalThis.Headers | Array<[string, string]>;
  /** a string, bytes or URLSearchParams as they are; anything else as its JSON (Content-Type application/json) */
  body?: string | Buffer | Uint8Array | ArrayBuffer | URLSearchParams | object | null;
  /** required: the Idempotency-Key of every attempt (at most 255 bytes) */
  key: string;
  /** attempts at most (default 5) */
  attempts?: number;
  /** milliseconds an attempt may take, its body included (default 10000) */
  timeoutMs?: number;
  /** the first backoff's ceiling in milliseconds, doubling per attempt, with jitter (default 500) */
  baseDelayMs?: number;
  /** the longest wait between attempts, Retry-After included (default 30000) */
  maxDelayMs?: number;
  /** default globalThis.fetch */
  fetch?: typeof globalThis.fetch;
}

export interface IdempotentResponse {
  /**
   * succeeded: a 2xx; failed: an answer that is not retried, or 429 to the
   * end (the callee did not act); unknown: the attempts ran out on a
   * timeout, a network error, 408 or 5xx (the callee may have acted: call
   * again later with the same key)
   */
  outcome: 'succeeded' | 'failed' | 'unknown';
  /** the last answer's status; null when the last attempt got none */
  status: number | null;
  /** the last answer's body; null when the last attempt got none */
  body: Buffer | null;
  headers: globalThis.Headers | null;
  key: string;
  /** attempts made */
  attempts: number;
  /** why the last attempt got no answer */
  error?: string;
}

/** Call a URL with an idempotency key, retrying only what may pass (never throws for "unknown"). */
export function idempotentRequest(url: string | URL, options: IdempotentRequestOptions): Promise<IdempotentResponse>;
