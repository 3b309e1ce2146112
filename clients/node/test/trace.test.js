// Trace ids and decision logs (idem.trace from traceparent, else the
// request id; transaction-local on a pooled connection), and the frozen
// outcome, in both HTTP integrations and withIdempotency.
'use strict';

const { describe, test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Writable } = require('node:stream');
const { Pool } = require('pg');
const Fastify = require('fastify');
const expressLib = require('express');
const idem = require('..');
const { traceIdOf, traceValue } = require('../lib/trace');
const { setupDatabase, newPool, call, randomUUID } = require('./support');

const admin = newPool();
// one connection: every request of an app runs on the same session
const single = new Pool({ max: 1 });
before(async () => {
  await setupDatabase(admin);
});
after(async () => { await single.end(); await admin.end(); });

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const TRACEPARENT = `00-${TRACE}-00f067aa0ba902b7-01`;

test('traceparent: version 00, 32 and 16 lower-case hex digits, neither all zero', () => {
  assert.equal(traceIdOf(TRACEPARENT), TRACE);
  assert.equal(traceIdOf(` ${TRACEPARENT} `), TRACE);
  for (const bad of [undefined, '', [TRACEPARENT, TRACEPARENT], TRACEPARENT.toUpperCase(), `01-${TRACE}-00f067aa0ba902b7-01`,
    `00-${'0'.repeat(32)}-00f067aa0ba902b7-01`, `00-${TRACE}-${'0'.repeat(16)}-01`, `00-${TRACE}-00f067aa0ba902b7`,
    `00-${TRACE}x-00f067aa0ba902b7-01`, `00-${TRACE}-00f067aa0ba902b7-01-extra`]) {
    assert.equal(traceIdOf(bad), null, String(bad));
  }
  assert.equal(traceValue('req-1'), 'req-1');
  assert.equal(Buffer.byteLength(traceValue('é'.repeat(200))), 254);
});

/** What a handler sees: idem.trace in its transaction. */
const seen = async (client) => (await client.query(`SELECT current_setting('idem.trace', true) AS t`)).rows[0].t;

async function fastifyApp(lines) {
  const stream = new Writable({ write(chunk, enc, cb) { lines.push(JSON.parse(chunk)); cb(); } });
  const app = Fastify({ logger: { level: 'info', stream } });
  await app.register(idem.fastify, { pool: single, tenant: (r) => r.headers['x-tenant'] || 'acme' });
  app.post('/orders', async (request, reply) => {
    reply.code(201);
    return { trace: await seen(request.idem.client), id: request.id, ran: randomUUID() };
  });
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, close: () => app.close() };
}

async function expressApp(lines) {
  const app = expressLib();
  const idempotent = idem.express({
    pool: single, tenant: (req) => req.headers['x-tenant'] || 'acme',
    requestId: (req) => req.headers['x-request-id'] || randomUUID(),
    logger: (fields) => lines.push(fields),
  });
  app.post('/orders', expressLib.json(), idempotent, idempotent.handler(async (req, res) => {
    res.status(201).json({ trace: await seen(req.idem.client), id: req.headers['x-request-id'], ran: randomUUID() });
  }));
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

const decisions = (lines) => lines.filter((l) => l.idempotency_key !== undefined);

for (const [name, make] of [['fastify', fastifyApp], ['express', expressApp]]) {
  describe(name, () => {
    const lines = [];
    let app;
    before(async () => { app = await make(lines); });
    after(() => app.close());

    test('the traceparent\'s trace-id is idem.trace of the claim\'s transaction, and of no later request on the connection', async () => {
      const key = randomUUID();
      const first = await call(app.url, '/orders', { key, headers: { traceparent: TRACEPARENT, 'x-request-id': 'r-1' } });
      assert.equal(first.status, 201, String(first.bytes));
      assert.equal(first.json().trace, TRACE);
      const { rows: [rec] } = await admin.query(
        `SELECT trace FROM idem_record WHERE tenant = 'acme' AND endpoint = 'POST /orders' AND key = $1`, [key]);
      assert.equal(rec.trace, TRACE);
      // the next request on the same (only) connection: its own id, not the trace before
      const second = await call(app.url, '/orders', { key: randomUUID(), headers: { 'x-request-id': 'r-2' } });
      assert.equal(second.status, 201);
      assert.notEqual(second.json().trace, TRACE);
      assert.equal(second.json().trace, String(second.json().id));
      // an invalid traceparent counts as none
      const third = await call(app.url, '/orders', {
        key: randomUUID(), headers: { traceparent: `00-${'0'.repeat(32)}-00f067aa0ba902b7-01`, 'x-request-id': 'r-3' },
      });
      assert.equal(third.json().trace, String(third.json().id));
      // a request without a key runs in a transaction with the trace too (for its enqueues)
      const plain = await call(app.url, '/orders', { headers: { traceparent: TRACEPARENT } });
      assert.equal(plain.json().trace, TRACE);
      // and outside any request the session has none
      assert.equal(await seen(single), '');
    });

    test('each decision is logged with idempotency_key, tenant, endpoint, outcome, attempt and trace_id', async () => {
      const key = randomUUID();
      await call(app.url, '/orders', { key, headers: { traceparent: TRACEPARENT } });
      const again = await call(app.url, '/orders', { key, headers: { traceparent: TRACEPARENT } });
      assert.equal(again.replayed, true);
      const mine = decisions(lines).filter((l) => l.idempotency_key === key);
      assert.deepEqual(mine.map((l) => [l.tenant, l.endpoint, l.outcome, l.attempt, l.trace_id]), [
        ['acme', 'POST /orders', 'claimed', 1, TRACE],
        ['acme', 'POST /orders', 'replay', 1, TRACE],
      ]);
    });

    test('a frozen endpoint: 503, Retry-After from until (else 60), problem+json naming the reason; nothing runs', async () => {
      const tenant = `frozen-${randomUUID()}`;
      await admin.query(`SELECT idem_freeze($1, 'POST /orders', 'duplicate charges, INC-7', now() + interval '120 seconds')`, [tenant]);
      try {
        const key = randomUUID();
        const r = await call(app.url, '/orders', { key, headers: { 'x-tenant': tenant } });
        assert.equal(r.status, 503, String(r.bytes));
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        const after = Number(r.headers.get('retry-after'));
        assert.ok(after > 100 && after <= 120, String(after));
        const p = r.json();
        assert.equal(p.status, 503);
        assert.equal(p.reason, 'duplicate charges, INC-7');
        assert.match(p.detail, /duplicate charges, INC-7/);
        const { rows } = await admin.query(`SELECT count(*)::int AS n FROM idem_record WHERE tenant = $1`, [tenant]);
        assert.equal(rows[0].n, 0);
        assert.ok(decisions(lines).some((l) => l.idempotency_key === key && l.outcome === 'frozen'));
        // frozen without until: 60 seconds
        await admin.query(`SELECT idem_thaw($1, 'POST /orders')`, [tenant]);
        await admin.query(`SELECT idem_freeze($1, NULL, 'maintenance')`, [tenant]);
        const r2 = await call(app.url, '/orders', { key: randomUUID(), headers: { 'x-tenant': tenant } });
        assert.equal(r2.status, 503);
        assert.equal(r2.headers.get('retry-after'), '60');
        assert.equal(r2.json().reason, 'maintenance');
      } finally {
        await admin.query(`SELECT idem_thaw($1, 'POST /orders'), idem_thaw($1, NULL)`, [tenant]);
      }
      const thawed = await call(app.url, '/orders', { key: randomUUID(), headers: { 'x-tenant': tenant } });
      assert.equal(thawed.status, 201);
    });
  });
}

describe('withIdempotency', () => {
  test('scope.trace (a traceparent) is the claim\'s idem.trace; the logger gets the decision', async () => {
    const lines = [];
    const key = randomUUID();
    const r = await idem.withIdempotency(single, {
      tenant: 'acme', endpoint: 'job:trace', key, trace: TRACEPARENT, logger: { info: (fields) => lines.push(fields) },
    }, async (client) => ({ status: 200, body: await seen(client) }));
    assert.equal(String(r.body), TRACE);
    assert.equal(await seen(single), '');
    assert.deepEqual(lines, [{ idempotency_key: key, tenant: 'acme', endpoint: 'job:trace', outcome: 'claimed', attempt: 1, trace_id: TRACE }]);
  });

  test('frozen: IdemError with outcome frozen, the reason and 503', async () => {
    const tenant = `frozen-${randomUUID()}`;
    await admin.query(`SELECT idem_freeze($1, 'job:frozen', 'stop the bleeding')`, [tenant]);
    try {
      await assert.rejects(idem.withIdempotency(single, { tenant, endpoint: 'job:frozen', key: 'k' }, () => assert.fail('ran')),
        (e) => e instanceof idem.IdemError && e.outcome === 'frozen' && e.statusCode === 503
          && e.reason === 'stop the bleeding' && e.retryAfter === 60 && /stop the bleeding/.test(e.message));
    } finally {
      await admin.query(`SELECT idem_thaw($1, 'job:frozen')`, [tenant]);
    }
  });
});
