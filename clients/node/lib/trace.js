// pg-idem/lib/trace.js: the trace id of a request (stored by idem on the
// record its claim executes, and on the outbox messages it enqueues, as
// idem.trace) and the log line of each decision, so that one grep pulls out
// every request and message of one intent.
'use strict';

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const ZEROS = /^0+$/;
/** The longest idem.trace idem accepts (bytes). */
const MAX_TRACE_LENGTH = 255;

/**
 * The trace-id of a W3C traceparent header (version 00:
 * `00-<32 hex>-<16 hex>-<2 hex>`), or null for anything else: absent, sent
 * twice, another version or format, an all-zero trace or parent id.
 * @param {unknown} value
 * @returns {string|null}
 */
function traceIdOf(value) {
  if (typeof value !== 'string') return null;
  const m = TRACEPARENT.exec(value.trim());
  if (!m || m[1] !== '00' || ZEROS.test(m[2]) || ZEROS.test(m[3])) return null;
  return m[2];
}

/**
 * A value for idem.trace: a traceparent's trace-id, else the text as given,
 * cut to 255 bytes (on a character boundary); '' for none.
 * @param {unknown} value
 * @returns {string}
 */
function traceValue(value) {
  if (value === undefined || value === null) return '';
  const text = String(value);
  const id = traceIdOf(text);
  if (id) return id;
  if (Buffer.byteLength(text) <= MAX_TRACE_LENGTH) return text;
  let cut = Buffer.from(text).subarray(0, MAX_TRACE_LENGTH).toString('utf8');
  while (Buffer.byteLength(cut) > MAX_TRACE_LENGTH || cut.endsWith('\uFFFD')) cut = cut.slice(0, -1);
  return cut;
}

/**
 * The trace of an HTTP request: the trace-id of its traceparent header,
 * else `fallback` (the framework's request id).
 * @param {Record<string, unknown>} headers
 * @param {unknown} fallback
 */
function requestTrace(headers, fallback) {
  return traceIdOf(headers && headers.traceparent) || traceValue(fallback);
}

/** Outcomes that are conflicts: logged as warnings. */
const CONFLICTS = new Set(['in_progress', 'mismatch', 'unknown', 'frozen']);

/**
 * Log one decision: `logger` is a function of the fields, or an object with
 * `info` and `warn` (pino and fastify's request.log: `(fields, message)`;
 * console prints both); none logs nothing.
 * @param {((fields: object) => void)|{info: Function, warn?: Function}|null|undefined} logger
 * @param {{idempotency_key: string, tenant: string, endpoint: string, outcome: string,
 *          attempt: number|null, trace_id: string}} fields
 */
function logDecision(logger, fields) {
  if (!logger) return;
  try {
    if (typeof logger === 'function') {
      logger(fields);
      return;
    }
    const level = CONFLICTS.has(fields.outcome) && typeof logger.warn === 'function' ? 'warn' : 'info';
    if (typeof logger[level] === 'function') {
      logger[level](fields, `idem ${fields.outcome}: ${fields.endpoint} key ${fields.idempotency_key}`);
    }
  } catch {
    // a logger that throws must not fail the request
  }
}

/** The fields of a decision's log line. */
function decisionFields(scope, claim, trace) {
  return {
    idempotency_key: scope.key,
    tenant: scope.tenant,
    endpoint: scope.endpoint,
    outcome: claim.outcome,
    attempt: claim.attempt ?? null,
    trace_id: trace || '',
  };
}

module.exports = { traceIdOf, traceValue, requestTrace, logDecision, decisionFields, MAX_TRACE_LENGTH };
