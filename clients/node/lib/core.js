// pg-idem/lib/core.js: what every integration shares: the SQL of a claim and
// of finishing it, the request fingerprint, the stored response's headers
// and the problem+json answers (RFC 9457).
'use strict';

const crypto = require('node:crypto');
const http = require('node:http');
const { traceValue } = require('./trace');

/** The longest key idem accepts (bytes; keys are ASCII header values). */
const MAX_KEY_LENGTH = 255;

// Headers that are never stored nor replayed: the server computes them for
// each answer (framing, hop-by-hop), or they describe this answer only.
const NOT_STORED = new Set([
  'connection', 'content-length', 'date', 'keep-alive', 'transfer-encoding',
  'idempotent-replayed', 'upgrade', 'trailer', 'te', 'proxy-connection',
]);

/**
 * An outcome of idem_claim that the caller cannot execute: `in_progress`,
 * `mismatch`, `unknown` or `frozen`.
 */
class IdemError extends Error {
  /**
   * @param {string} outcome
   * @param {object} [claim] the row of idem_claim
   */
  constructor(outcome, claim = {}) {
    super(MESSAGES[outcome] || `idem: outcome ${outcome}`);
    this.name = 'IdemError';
    this.outcome = outcome;
    this.attempt = claim.attempt ?? null;
    this.statusCode = outcome === 'mismatch' ? 422 : outcome === 'frozen' ? 503 : 409;
    if (outcome === 'frozen') {
      this.message = frozenDetail(claim);
      this.reason = claim.reason ?? null;
      this.until = claim.until ?? null;
      this.retryAfter = frozenRetryAfter(claim);
    }
  }
}

const MESSAGES = {
  in_progress: 'a request with this idempotency key is in progress',
  mismatch: 'this idempotency key was used with a different request',
  unknown: 'a request with this idempotency key did not finish; it is being reconciled',
  frozen: 'this endpoint is frozen: nothing was done',
};

/** Retry-After of a frozen endpoint, in seconds: until `until`, else 60. */
function frozenRetryAfter(claim) {
  if (!claim.until) return 60;
  const ms = new Date(claim.until).getTime() - Date.now();
  return Number.isFinite(ms) ? Math.max(1, Math.ceil(ms / 1000)) : 60;
}

/** What a frozen endpoint answers, with its reason and until when. */
function frozenDetail(claim) {
  const until = claim.until ? ` until ${new Date(claim.until).toISOString()}` : '';
  return `this endpoint is frozen${until}${claim.reason ? `: ${claim.reason}` : ''}; nothing was done`;
}

/**
 * JSON with object keys sorted at every level: the same document always
 * gives the same text, whatever its key order or white space.
 * @param {unknown} value
 * @returns {string}
 */
function canonicalJson(value) {
  if (value === null || typeof value !== 'object') {
    const s = JSON.stringify(value);
    return s === undefined ? 'null' : s;
  }
  if (typeof value.toJSON === 'function') return canonicalJson(value.toJSON());
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
}

/**
 * The bytes of a request body as the fingerprint sees them: raw bytes as
 * they are, a string as UTF-8, a parsed document as canonical JSON.
 * @param {unknown} body
 * @returns {Buffer}
 */
function bodyBytes(body) {
  if (body === undefined || body === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body);
  if (typeof body === 'string') return Buffer.from(body);
  return Buffer.from(canonicalJson(body));
}

/**
 * The default fingerprint: SHA-256 over the method, the path (with its
 * query string) and the canonical body.
 * @param {string} method
 * @param {string} path
 * @param {unknown} body
 * @returns {Buffer}
 */
function fingerprintOf(method, path, body) {
  return crypto.createHash('sha256')
    .update(`${method.toUpperCase()}\n${path}\n`)
    .update(bodyBytes(body))
    .digest();
}

/**
 * A response body as the bytes to store: null stays null (no body).
 * @param {unknown} body
 * @returns {Buffer|null}
 */
function responseBytes(body) {
  if (body === undefined || body === null) return null;
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body);
  if (typeof body === 'string') return Buffer.from(body);
  return Buffer.from(JSON.stringify(body));
}

/**
 * Headers as idem stores them: names to strings or arrays of strings,
 * without the ones the server computes.
 * @param {Iterable<[string, unknown]>} entries
 * @returns {Record<string, string|string[]>}
 */
function storableHeaders(entries) {
  const out = {};
  for (const [name, value] of entries) {
    if (value === undefined || value === null || NOT_STORED.has(name.toLowerCase())) continue;
    out[name] = Array.isArray(value) ? value.map(String) : String(value);
  }
  return out;
}

/**
 * Validate an idempotency key header value.
 * @param {unknown} value the header's value (an array if sent twice)
 * @returns {{key?: string, problem?: object}} the key, or the 400 to answer
 */
function checkKey(value, header) {
  if (Array.isArray(value)) {
    return { problem: problem(400, `send one ${header} header, not ${value.length}`, 'idempotency-key-invalid') };
  }
  // an empty header is no key, as in pg-idem for Python: the request runs
  // without a claim, or is refused where the key is required
  if (value === undefined || value === '') return {};
  if (Buffer.byteLength(value) > MAX_KEY_LENGTH) {
    return { problem: problem(400, `the ${header} header is longer than ${MAX_KEY_LENGTH} characters`, 'idempotency-key-invalid') };
  }
  return { key: value };
}

/**
 * A problem+json answer (RFC 9457).  `type` stays about:blank, so `title`
 * is the status's reason phrase; `code` names the case for programs.
 * @returns {{status: number, headers: Record<string,string>, body: Buffer}}
 */
function problem(status, detail, code, extraHeaders = {}, members = {}) {
  const body = { type: 'about:blank', title: http.STATUS_CODES[status] || 'Error', status, detail };
  if (code) body.code = code;
  Object.assign(body, members);
  return {
    status,
    headers: { 'Content-Type': 'application/problem+json', ...extraHeaders },
    body: Buffer.from(JSON.stringify(body)),
  };
}

/**
 * The answer to an outcome that does not execute, as {status, headers, body}.
 * @param {object} claim the row of idem_claim
 * @param {{retryAfter: number}} opts
 */
function outcomeAnswer(claim, { retryAfter }) {
  switch (claim.outcome) {
    case 'replay':
      return {
        status: claim.status,
        headers: { ...storableHeaders(Object.entries(claim.headers || {})), 'Idempotent-Replayed': 'true' },
        body: claim.body,
      };
    case 'in_progress':
      return problem(409, MESSAGES.in_progress, 'idempotency-key-in-progress', { 'Retry-After': String(retryAfter) });
    case 'unknown':
      return problem(409, MESSAGES.unknown, 'idempotency-key-unknown', { 'Retry-After': String(retryAfter) });
    case 'mismatch':
      return problem(422, MESSAGES.mismatch, 'idempotency-key-mismatch');
    case 'frozen':
      return problem(503, frozenDetail(claim), 'idempotency-endpoint-frozen',
        { 'Retry-After': String(frozenRetryAfter(claim)) },
        { reason: claim.reason ?? null, until: claim.until ? new Date(claim.until).toISOString() : null });
    default:
      throw new Error(`pg-idem: outcome ${claim.outcome} is the caller's to execute`);
  }
}

/**
 * The prefix that qualifies idem's functions with the schema the extension
 * was created in (`CREATE EXTENSION idem SCHEMA api`): `"api".`, quoted as
 * an identifier; none (the search_path decides) when no schema is given.
 * @param {string|null|undefined} schema
 * @returns {string}
 */
function qualifier(schema) {
  if (schema === undefined || schema === null) return '';
  if (typeof schema !== 'string' || schema === '') {
    throw new TypeError('pg-idem: the schema option must be a non-empty string');
  }
  return `"${schema.replace(/"/g, '""')}".`;
}

/** A PostgreSQL interval for a number of milliseconds, or a string as given. */
function interval(v) {
  if (v === undefined || v === null) return null;
  return typeof v === 'number' ? `${v} milliseconds` : String(v);
}

/**
 * Set idem.trace for the client's open transaction (SET LOCAL: it ends
 * with the transaction, so it never reaches the pool's next user).
 * Nothing when `trace` is undefined.
 * @param {import('pg').ClientBase} client
 * @param {string|undefined} trace
 */
async function setTrace(client, trace) {
  if (trace === undefined) return;
  await client.query(`SELECT set_config('idem.trace', $1, true)`, [traceValue(trace)]);
}

/**
 * Why and until when a (tenant, endpoint) is frozen: `{reason, until}`,
 * both null if idem cannot say.  The one place that asks idem
 * (idem_frozen(tenant, endpoint)); run it outside a failed transaction.
 * @param {import('pg').ClientBase} client
 * @returns {Promise<{reason: string|null, until: Date|null}>}
 */
async function frozenInfo(client, { schema, tenant, endpoint }) {
  try {
    const { rows: [row] } = await client.query(
      `SELECT reason, until FROM ${qualifier(schema)}idem_frozen($1, $2)`, [tenant, endpoint]);
    return { reason: (row && row.reason) ?? null, until: (row && row.until) ?? null };
  } catch {
    return { reason: null, until: null };
  }
}

/**
 * Claim a key in the client's open transaction.
 * @param {import('pg').ClientBase} client
 * @returns {Promise<object>} the row of idem_claim
 */
async function claimKey(client, { schema, tenant, endpoint, key, fingerprint, wait, waitTimeout, lease }) {
  let previous = null;
  if (wait) {
    // lock_timeout bounds the wait for an uncommitted claim, wait_timeout
    // the wait for a committed one; the handler gets lock_timeout back
    ({ rows: [{ previous }] } = await client.query(
      `SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $1, true)`,
      [`${Number(waitTimeout)}ms`]));
  }
  let fp = fingerprint ?? null;
  if (fp !== null && !Buffer.isBuffer(fp)) fp = Buffer.from(String(fp));
  try {
    const { rows: [row] } = await client.query(
      `SELECT outcome, status, body, headers, attempt, expires_at
         FROM ${qualifier(schema)}idem_claim($1, $2, $3, $4::bytea, wait => $5, lease => $6::interval,
                         wait_timeout => $7::interval)`,
      [tenant, endpoint, key, fp, Boolean(wait), interval(lease), wait ? interval(waitTimeout) : null]);
    if (previous !== null) await client.query(`SELECT set_config('lock_timeout', $1, true)`, [previous]);
    return row;
  } catch (e) {
    // a wait that ran into lock_timeout: the other claim is still running
    if (wait && e.code === '55P03') return { outcome: 'in_progress', timedOut: true };
    throw e;
  }
}

/**
 * Finish a claim in its transaction, by the response's status:
 *   below 400  idem_complete: stored, replayed, the handler's writes kept
 *   400-499    idem_fail (not retryable): a business failure, stored and
 *              replayed, the handler's writes kept (unless it threw)
 *   500 up     the handler's writes rolled back to the savepoint taken
 *              after the claim, idem_fail(retryable): the retry executes
 * `store` (true or false) overrides the status's verdict on retrying;
 * `rollback` rolls the handler's writes back whatever the status.
 * @returns {Promise<'stored'|'retryable'>}
 */
async function finishClaim(client, claim, { schema, tenant, endpoint, key }, response, { store, rollback } = {}) {
  const { status } = response;
  const body = responseBytes(response.body);
  const headers = JSON.stringify(response.headers || {});
  const keep = store ?? status < 500;
  if (!keep || rollback) await client.query('ROLLBACK TO SAVEPOINT idem_handler');
  if (keep && status < 400) {
    await client.query(
      `SELECT ${qualifier(schema)}idem_complete($1, $2, $3, $4, $5::bytea, attempt => $6, headers => $7::jsonb)`,
      [tenant, endpoint, key, status, body, claim.attempt, headers]);
  } else {
    await client.query(
      `SELECT ${qualifier(schema)}idem_fail($1, $2, $3, $4, $5::bytea, retryable => $6, attempt => $7, headers => $8::jsonb)`,
      [tenant, endpoint, key, status, body, !keep, claim.attempt, headers]);
  }
  return keep ? 'stored' : 'retryable';
}

/**
 * Open a transaction on a client of the pool and claim.  Resolves to the
 * client (still in the transaction) and the claim; for `claimed`, a
 * savepoint "idem_handler" follows the claim.  A scope without a key
 * claims nothing: the claim is null and the transaction is the handler's.
 */
async function begin(pool, scope, opts) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await setTrace(client, scope.trace);
    if (scope.key === null) return { client, claim: null };
    const claim = await claimKey(client, { ...scope, ...opts });
    if (claim.outcome === 'claimed') {
      await client.query('SAVEPOINT idem_handler');
    } else {
      await client.query('ROLLBACK');
      if (claim.outcome === 'frozen') Object.assign(claim, await frozenInfo(client, scope));
    }
    return { client, claim };
  } catch (e) {
    await client.query('ROLLBACK').catch(() => {});
    client.release();
    throw e;
  }
}

/** The SQLSTATE of an error the server raised; null for any other error. */
function sqlstateOf(err) {
  const code = err && err.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : null;
}

/**
 * Whether a failed store or commit may succeed when tried again: no answer
 * from the server (a broken connection: no SQLSTATE), or SQLSTATE class 08
 * (connection), 40 (serialization, deadlock), 53 (resources), 57 (operator
 * intervention, shutdown) or 58 (system), or 55P03 (lock timeout).  Anything
 * else (54000, a response over idem.max_body_size, say) fails again.
 */
function isTransient(err) {
  const code = sqlstateOf(err);
  return code === null || /^(08|40|53|57|58)/.test(code) || code === '55P03';
}

/**
 * The answer to a request whose transaction could not be stored or
 * committed, everything in it rolled back.  A transient failure: 503, retry
 * (under a key a retry is safe even if a lost connection hid a commit).
 * Any other: 500, not retryable, and for a claim that failure is recorded
 * under the key (idem_fail, not retryable, in a transaction of its own), so
 * that a retry replays it instead of running the handler again to fail the
 * same way.
 * @param {{client: import('pg').ClientBase, claim: object|null, scope: object, fingerprint: unknown,
 *          retryAfter: number}} tx
 * @param {Error} err
 */
async function failureAnswer(tx, err) {
  const what = tx.claim ? 'the response could not be stored' : 'the transaction could not be committed';
  if (isTransient(err)) {
    return problem(503, `${what}; retry the request`, 'idempotency-store-failed',
      { 'Retry-After': String(tx.retryAfter) });
  }
  const answer = problem(500, `${what} (SQLSTATE ${err.code}), and nothing was done${
    tx.claim ? '; a retry with this key gets this answer again' : ''}`, 'idempotency-store-failed');
  if (tx.claim) {
    try {
      await tx.client.query('BEGIN');
      await setTrace(tx.client, tx.scope.trace);
      const claim = await claimKey(tx.client, { ...tx.scope, fingerprint: tx.fingerprint });
      if (claim.outcome === 'claimed') {
        await finishClaim(tx.client, claim, tx.scope, answer, { store: true });
        await tx.client.query('COMMIT');
      } else {
        await tx.client.query('ROLLBACK');
      }
    } catch (e) {
      // the key stays claimable: the answer still says what happened
      await tx.client.query('ROLLBACK').catch(() => {});
      tx.report(e, 'recording that the response could not be stored failed');
    }
  }
  return answer;
}

/**
 * Settle a request's transaction once the handler's response is known,
 * before a byte of it is sent, and give the client back to its pool.  With
 * a claim: finishClaim and COMMIT.  Without one: COMMIT, or ROLLBACK when
 * the status is 500 or more or the handler threw.  `thrown` is the error
 * the handler threw (undefined: none).  Resolves to null (send the response)
 * or, when that failed, to the problem answer to send instead; `tx.report`
 * gets the error first.
 */
async function settle(tx, response, thrown) {
  const { client } = tx;
  try {
    try {
      if (tx.claim) {
        await finishClaim(client, tx.claim, tx.scope, response,
          thrown === undefined ? {} : { store: isStoredError(thrown), rollback: true });
        await client.query('COMMIT');
      } else {
        await client.query(thrown === undefined && response.status < 500 ? 'COMMIT' : 'ROLLBACK');
      }
      return null;
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {});
      tx.report(e, tx.claim ? 'storing the response failed' : 'committing the transaction failed');
      return await failureAnswer(tx, e);
    }
  } finally {
    client.release();
  }
}

/**
 * The problem+json answer to an error a handler threw, with `status` (by
 * default the one the error asks for).  A 4xx says the error's message: the
 * handler raised it for the client; a 5xx says nothing of its internals.
 */
function thrownProblem(err, status = errorStatus(err)) {
  return status < 500
    ? problem(status, String((err && err.message) || http.STATUS_CODES[status]), 'request-failed')
    : problem(status, 'the request failed, and nothing was done', 'request-failed');
}

/** One line about a failed request for a log: the key, and the SQLSTATE and message, or the stack. */
function failureLine(what, err, idem) {
  const who = idem ? `${idem.endpoint} ${idem.key === null ? 'without a key' : `key ${idem.key}`}` : 'a request';
  const code = sqlstateOf(err);
  return `pg-idem: ${who}: ${what}: ${code ? `SQLSTATE ${code}: ${err.message}` : String((err && err.stack) || err)}`;
}

/**
 * The status an error asks for: `statusCode` or `status`, 500 if neither
 * is an HTTP error status.
 */
function errorStatus(err) {
  const s = Number(err && (err.statusCode ?? err.status));
  return Number.isInteger(s) && s >= 400 && s <= 599 ? s : 500;
}

/**
 * Whether a thrown error is a business failure, stored and replayed: one
 * with `idemStore: true`, or with a 4xx status and no `idemStore: false`.
 */
function isStoredError(err) {
  if (err && err.idemStore !== undefined) return Boolean(err.idemStore);
  return errorStatus(err) < 500;
}

/** Shared option defaults of the HTTP integrations. */
function httpOptions(options = {}) {
  if (!options.pool) throw new TypeError('pg-idem: the pool option is required');
  if (options.tenant === undefined) throw new TypeError('pg-idem: the tenant option is required');
  if (options.onError !== undefined && typeof options.onError !== 'function') {
    throw new TypeError('pg-idem: the onError option must be a function');
  }
  qualifier(options.schema);  // a schema it cannot name is refused now, not at the first request
  const waitTimeout = options.wait === true ? 10000 : Number(options.wait || 0);
  return {
    pool: typeof options.pool === 'function' && typeof options.pool.connect !== 'function'
      ? options.pool : () => options.pool,
    tenant: typeof options.tenant === 'function' ? options.tenant : () => options.tenant,
    required: Boolean(options.required),
    header: options.header || 'Idempotency-Key',
    wait: waitTimeout > 0,
    waitTimeout,
    lease: options.lease,
    retryAfter: options.retryAfter ?? 1,
    methods: new Set((options.methods || ['POST', 'PATCH']).map((m) => m.toUpperCase())),
    fingerprint: options.fingerprint,
    schema: options.schema ?? null,
    onError: options.onError,
  };
}

/** The tenant of a request, checked. */
async function tenantOf(opts, request) {
  const tenant = await opts.tenant(request);
  if (typeof tenant !== 'string' || tenant === '') {
    throw new TypeError('pg-idem: the tenant callback must return a non-empty string');
  }
  return tenant;
}

/** The fingerprint of a request by the option: a function, false/null (none), or the default. */
function requestFingerprint(opts, request, method, path, body) {
  if (typeof opts.fingerprint === 'function') return opts.fingerprint(request);
  if (opts.fingerprint === false || opts.fingerprint === null) return null;
  return fingerprintOf(method, path, body);
}

module.exports = {
  MAX_KEY_LENGTH, IdemError, canonicalJson, fingerprintOf, responseBytes, storableHeaders,
  checkKey, problem, outcomeAnswer, setTrace, frozenInfo, frozenRetryAfter, claimKey, finishClaim, begin, settle, failureAnswer, thrownProblem,
  failureLine, errorStatus, isStoredError, httpOptions, tenantOf, requestFingerprint, interval, qualifier,
};
