// pg-idem/lib/retry.js: the one policy of every outbound HTTP call the
// package makes (the outbox dispatcher's POSTs and idempotentRequest): which
// answers are worth another attempt, how long to wait before it, and what
// the caller may conclude when the attempts run out.
'use strict';

/**
 * Whether an answer's status is worth another attempt: 408 (the server gave
 * up waiting), 429 (too many requests) and 5xx (the server is busy or broken
 * for now).  Any other status, 3xx and 4xx included, says the same again.
 * @param {number} status
 * @returns {boolean}
 */
function isRetriedStatus(status) {
  return status === 408 || status === 429 || (status >= 500 && status <= 599);
}

/**
 * What an answer is:
 *   'success'    2xx
 *   'retry'      408, 429, 5xx: try again
 *   'final'      anything else: another attempt gets the same answer
 * @param {number} status
 * @returns {'success'|'retry'|'final'}
 */
function classify(status) {
  if (status >= 200 && status <= 299) return 'success';
  return isRetriedStatus(status) ? 'retry' : 'final';
}

/**
 * Whether the callee may have acted although no success came back: no
 * answer at all (a timeout, a broken connection: `status` null), 408 or a
 * 5xx.  A 429 says the request was not taken.
 * @param {number|null} status
 * @returns {boolean}
 */
function mayHaveActed(status) {
  return status === null || status === 408 || (status >= 500 && status <= 599);
}

/**
 * Milliseconds from a Retry-After header: delay-seconds or an HTTP-date
 * (RFC 9110, 10.2.3); null when absent or unreadable.
 * @param {string|null|undefined} value
 * @returns {number|null}
 */
function retryAfterMs(value) {
  if (value === null || value === undefined) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  return Number.isNaN(date) ? null : Math.max(0, date - Date.now());
}

/**
 * The wait before attempt `attempt + 1` when the answer named none:
 * exponential from `baseMs` (doubling per attempt, at most `maxMs`), with
 * full jitter (a random share of it, at least half), so that callers that
 * failed together do not come back together.
 * @param {number} attempt the attempt that just failed, from 1
 * @param {{baseMs?: number, maxMs?: number, random?: () => number}} [opts]
 * @returns {number} milliseconds
 */
function backoffMs(attempt, { baseMs = 500, maxMs = 30000, random = Math.random } = {}) {
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(ceiling / 2 + random() * (ceiling / 2));
}

module.exports = { isRetriedStatus, classify, mayHaveActed, retryAfterMs, backoffMs };
