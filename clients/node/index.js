// pg-idem: idempotency keys for Node.js on PostgreSQL's idem extension.
//
//   const idem = require('pg-idem');
//   app.register(idem.fastify, { pool, tenant: (request) => request.user.tenant });  // fastify
//   const idempotent = idem.express({ pool, tenant });                                // Express
//   app.post('/orders', express.json(), idempotent, idempotent.handler(async (req, res) => ...));
//   const r = await idem.withIdempotency(pool, { tenant, endpoint, key }, async (client) => ...);
//   await idem.enqueue(client, { tenant, topic, key, payload });   // the outbox, in your transaction
//   idem.createDispatcher({ pool, topic, url }).start();           // delivers it
//   idem.registerIdempotentTool(server, { pool, tenant, task }, 'charge', config, handler);  // an MCP tool
//   const r = await idem.idempotentRequest(url, { key, body });    // calling another service
'use strict';

const core = require('./lib/core');
const fastify = require('./lib/fastify');
const express = require('./lib/express');
const outbox = require('./lib/outbox');
const trace = require('./lib/trace');
const { registerIdempotentTool } = require('./lib/tool');
const { idempotentRequest } = require('./lib/request');

/**
 * Run `fn` at most once per (tenant, endpoint, key), in the claim's
 * transaction, and store its result for every retry.
 *
 * - claimed: `fn(client)` runs inside the transaction (after a savepoint);
 *   its `{status, headers, body}` is stored: below 400 with idem_complete,
 *   400-499 as a business failure (idem_fail, replayed), 500 and up as a
 *   retryable failure with fn's writes rolled back.  If fn throws, its
 *   writes are rolled back, a retryable failure is recorded and the error
 *   is thrown again: the next call runs fn again.
 * - replay: fn does not run; the stored response comes back.
 * - in_progress, mismatch, unknown, frozen: throws an IdemError with
 *   `.outcome` (frozen: with `.reason`, `.until` and `.retryAfter`).
 *
 * `scope.schema` names the extension's schema where the search_path does
 * not find it.  `scope.trace` (a W3C traceparent, whose trace-id is taken,
 * or any id) is the claim's idem.trace, for this transaction only;
 * `scope.logger` gets the decision.
 *
 * @param {import('pg').Pool} pool
 * @param {import('.').Scope} scope
 * @param {(client: import('pg').PoolClient) => Promise<import('.').Response>} fn
 * @returns {Promise<import('.').Result>}
 */
async function withIdempotency(pool, scope, fn) {
  const { tenant, endpoint, key } = scope;
  const schema = scope.schema ?? null;
  const waitTimeout = scope.wait === true ? 10000 : Number(scope.wait || 0);
  const traceId = scope.trace === undefined || scope.trace === null ? undefined : trace.traceValue(scope.trace);
  const { client, claim } = await core.begin(pool, { schema, tenant, endpoint, key, trace: traceId }, {
    fingerprint: fingerprintArg(scope.fingerprint), wait: waitTimeout > 0, waitTimeout, lease: scope.lease,
  });
  trace.logDecision(scope.logger, trace.decisionFields({ tenant, endpoint, key }, claim, traceId));
  if (claim.outcome === 'replay') {
    client.release();
    return {
      outcome: 'replay', status: claim.status, headers: claim.headers || {}, body: claim.body,
      replayed: true, attempt: claim.attempt,
    };
  }
  if (claim.outcome !== 'claimed') {
    client.release();
    throw new core.IdemError(claim.outcome, claim);
  }
  let response;
  try {
    try {
      response = normalize(await fn(client));
    } catch (err) {
      await core.finishClaim(client, claim, { schema, tenant, endpoint, key }, { status: 500, body: null }, { store: false });
      await client.query('COMMIT');
      throw err;
    }
    const verdict = await core.finishClaim(client, claim, { schema, tenant, endpoint, key }, response);
    await client.query('COMMIT');
    return {
      outcome: 'claimed', status: response.status, headers: response.headers, body: response.body,
      replayed: false, attempt: claim.attempt, retryable: verdict === 'retryable',
    };
  } catch (e) {
    await client.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    client.release();
  }
}

function fingerprintArg(fp) {
  if (fp === undefined || fp === null) return null;
  if (Buffer.isBuffer(fp) || typeof fp === 'string') return fp;
  return Buffer.from(core.canonicalJson(fp));
}

function normalize(r) {
  const res = r || {};
  const status = res.status ?? 200;
  if (!Number.isInteger(status) || status < 100 || status > 599) {
    throw new TypeError(`pg-idem: status ${status} is not an HTTP status`);
  }
  return { status, headers: res.headers || {}, body: core.responseBytes(res.body) };
}

module.exports = {
  fastify,
  express,
  withIdempotency,
  enqueue: outbox.enqueue,
  createDispatcher: outbox.createDispatcher,
  registerIdempotentTool,
  idempotentRequest,
  IdemError: core.IdemError,
  canonicalJson: core.canonicalJson,
  fingerprint: core.fingerprintOf,
  MAX_KEY_LENGTH: core.MAX_KEY_LENGTH,
};
