// pg-idem/lib/request.js: the caller's side of idempotency keys.
//
//   const r = await idem.idempotentRequest('https://billing.example/charges', {
//     method: 'POST', body: { amount: 42 }, key: `charge-${order.id}`,
//   });
//   if (r.outcome === 'unknown') ...   // the callee may have acted: retry later with the same key, or reconcile
//
// One key for every attempt, so that the callee executes the request at
// most once; only answers that another attempt may change are retried
// (lib/retry.js, the policy the outbox dispatcher follows too).
'use strict';

const { setTimeout: sleep } = require('node:timers/promises');
const retry = require('./retry');
const { MAX_KEY_LENGTH } = require('./core');

/** Answers in a row, the same status and body, after which another attempt is pointless. */
const IDENTICAL_ANSWERS = 3;

function positive(name, value, fallback, integer) {
  const v = value ?? fallback;
  if (typeof v !== 'number' || !(v > 0) || (integer && !Number.isInteger(v))) {
    throw new TypeError(`pg-idem: ${name} must be a positive ${integer ? 'integer' : 'number'}, not ${value}`);
  }
  return v;
}

/** The request body as fetch sends it, and whether it is JSON pg-idem serialized. */
function bodyArg(body) {
  if (body === undefined || body === null) return { body: undefined, json: false };
  if (typeof body === 'string' || Buffer.isBuffer(body) || body instanceof Uint8Array
    || body instanceof ArrayBuffer || body instanceof URLSearchParams) {
    return { body, json: false };
  }
  return { body: JSON.stringify(body), json: true };
}

/** An error's message with its cause (fetch's "fetch failed" says nothing on its own). */
function describe(err) {
  const cause = err && err.cause;
  return cause ? `${err.message}: ${cause.code || cause.message || cause}` : String((err && err.message) || err);
}

/**
 * Call `url` with an idempotency key, retrying what may pass.
 *
 * - `key` is required (a TypeError before any call without it) and sent
 *   as `Idempotency-Key` on every attempt.
 * - Retried: a network error, no answer within `timeoutMs`, 408, 429 and
 *   5xx; after `Retry-After` (seconds or an HTTP-date, at most
 *   `maxDelayMs`) if the answer has one, else an exponential backoff from
 *   `baseDelayMs` with jitter.  Never any other status.
 * - Stops early after three identical answers (status and body) in a row.
 * - Resolves, never rejects for an outcome: `succeeded` (2xx), `failed`
 *   (an answer that is not retried, or 429 to the end: the callee did not
 *   act) or `unknown` (the attempts ran out on a timeout, a network error,
 *   408 or 5xx: the callee may have acted; retry later with the same key).
 *
 * @param {string|URL} url
 * @param {import('..').IdempotentRequestOptions} options
 * @returns {Promise<import('..').IdempotentResponse>}
 */
async function idempotentRequest(url, options = {}) {
  const { key } = options;
  if (typeof key !== 'string' || key === '') {
    throw new TypeError('pg-idem: idempotentRequest needs a key (the Idempotency-Key of every attempt)');
  }
  if (Buffer.byteLength(key) > MAX_KEY_LENGTH) {
    throw new TypeError(`pg-idem: the key is longer than ${MAX_KEY_LENGTH} bytes`);
  }
  const attempts = positive('attempts', options.attempts, 5, true);
  const timeoutMs = positive('timeoutMs', options.timeoutMs, 10000, false);
  const baseDelayMs = positive('baseDelayMs', options.baseDelayMs, 500, false);
  const maxDelayMs = positive('maxDelayMs', options.maxDelayMs, 30000, false);
  const method = String(options.method || 'POST').toUpperCase();
  const doFetch = options.fetch || globalThis.fetch;
  if (typeof doFetch !== 'function') throw new TypeError('pg-idem: idempotentRequest needs fetch (Node.js >= 18)');
  const target = new URL(String(url)).href;
  // everything a call could refuse is checked now, before the first call
  const headers = new Headers(options.headers || {});
  headers.set('Idempotency-Key', key);
  const { body, json } = bodyArg(options.body);
  if (json && !headers.has('Content-Type')) headers.set('Content-Type', 'application/json');

  let last = { status: null, body: null, headers: null, error: null };
  let same = 0;
  let previous = null;
  let made = 0;
  while (made < attempts) {
    made += 1;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    let delay = null;
    try {
      const res = await doFetch(target, { method, headers, body, signal: controller.signal });
      const bytes = Buffer.from(await res.arrayBuffer());
      last = { status: res.status, body: bytes, headers: res.headers, error: null };
      const kind = retry.classify(res.status);
      if (kind === 'success') return result('succeeded', last, key, made);
      if (kind === 'final') return result('failed', last, key, made);
      const signature = `${res.status}\n${bytes.toString('base64')}`;
      same = signature === previous ? same + 1 : 1;
      previous = signature;
      if (same >= IDENTICAL_ANSWERS) break;
      delay = retry.retryAfterMs(res.headers.get('retry-after'));
    } catch (e) {
      const error = controller.signal.aborted ? `no answer within ${timeoutMs} ms` : describe(e);
      last = { status: null, body: null, headers: null, error };
      same = 0;
      previous = null;
    } finally {
      clearTimeout(timer);
    }
    if (made < attempts) {
      await sleep(Math.min(maxDelayMs, delay ?? retry.backoffMs(made, { baseMs: baseDelayMs, maxMs: maxDelayMs })));
    }
  }
  return result(retry.mayHaveActed(last.status) ? 'unknown' : 'failed', last, key, made);
}

function result(outcome, last, key, attempts) {
  const r = { outcome, status: last.status, body: last.body, headers: last.headers, key, attempts };
  if (last.error) r.error = last.error;
  return r;
}

module.exports = { idempotentRequest };
