// The HTTP behaviour of both integrations (fastify and Express), against a
// real PostgreSQL with idem and real HTTP clients.
'use strict';

const { describe, test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { setupDatabase, Gates, call, until, newPool, randomUUID } = require('./support');
const { fastifyApp, expressApp } = require('./apps');

const pool = newPool();
before(() => setupDatabase(pool));
after(() => pool.end());

const stored = async (endpoint, key) => (await pool.query(
  `SELECT state, status, attempt, body, headers FROM idem_list('acme', $1, true, 100000) WHERE key = $2`,
  [endpoint, key])).rows[0];

// a backend waiting for a lock while it claims: the waiting duplicate
const waitingClaims = async () => Number((await pool.query(
  `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim%'`)).rows[0].count);

function assertProblem(r, status) {
  assert.equal(r.status, status);
  assert.equal(r.headers.get('content-type'), 'application/problem+json');
  const p = r.json();
  assert.equal(p.status, status);
  assert.equal(p.type, 'about:blank');
  assert.equal(typeof p.title, 'string');
  assert.equal(typeof p.detail, 'string');
}

for (const [name, make] of [['fastify', fastifyApp], ['express', expressApp]]) {
  describe(name, () => {
    const gates = new Gates();
    let app;
    before(async () => { app = await make(pool, gates); });
    after(() => app.close());

    test('a fresh request executes once; its retry replays status, headers and body byte for byte', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/items/7', { key, headers: { 'x-test-id': id } });
      assert.equal(first.status, 201);
      assert.equal(first.replayed, false);
      assert.equal(first.json().outcome, 'claimed');
      const again = await call(app.url, '/items/7', { key, headers: { 'x-test-id': id }, body: '{ "a" : 1 }' });
      assert.equal(again.status, 201);
      assert.equal(again.replayed, true);
      assert.deepEqual(again.bytes, first.bytes);
      assert.ok(again.bytes.length > 0);
      assert.equal(again.headers.get('location'), first.headers.get('location'));
      assert.match(again.headers.get('content-type'), /^application\/json/);
      assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
      assert.equal(app.counts.get(`item:${id}`), 1);
      const rec = await stored('POST /items/:id', key);
      assert.equal(rec.state, 'succeeded');
      assert.deepEqual(rec.body, first.bytes);
      const names = Object.keys(rec.headers).map((h) => h.toLowerCase());
      assert.ok(names.includes('location') && !names.includes('content-length'), names.join(','));
    });

    test('the endpoint is the route template: another id under the same key is the same request path-wise refused', async () => {
      const key = randomUUID();
      assert.equal((await call(app.url, '/items/1', { key })).status, 201);
      // same template, another path: the fingerprint (method, path, body) differs
      assertProblem(await call(app.url, '/items/2', { key }), 422);
    });

    test('required mode: a request without a key gets 400 problem+json and runs nothing', async () => {
      const id = randomUUID();
      const r = await call(app.url, '/required/items/1', { headers: { 'x-test-id': id } });
      assertProblem(r, 400);
      assert.equal(app.counts.get(`item:${id}`), undefined);
    });

    test('not required: a request without a key runs the handler, every time, in a transaction that claims nothing', async () => {
      const id = randomUUID();
      const a = await call(app.url, '/items/1', { headers: { 'x-test-id': id } });
      const b = await call(app.url, '/items/1', { headers: { 'x-test-id': id } });
      assert.equal(a.status, 201);
      assert.deepEqual({ ...a.json(), id: 0, nonce: '' }, { id: 0, nonce: '', outcome: 'none', key: null, attempt: null });
      assert.equal(b.replayed, false);
      assert.notDeepEqual(a.bytes, b.bytes);
      assert.equal(app.counts.get(`item:${id}`), 2);
      // the handler's writes committed before the answer was sent
      const { rows } = await pool.query('SELECT nonce FROM items WHERE nonce = ANY($1)', [[a.json().nonce, b.json().nonce]]);
      assert.equal(rows.length, 2);
      // an empty key is no key: the handler runs again, claiming nothing
      const c = await call(app.url, '/items/1', { headers: { 'x-test-id': id, 'idempotency-key': '' } });
      assert.equal(c.status, 201);
      assert.equal(c.json().outcome, 'none');
      assert.equal(app.counts.get(`item:${id}`), 3);
    });

    test('without a key, a handler that throws gets a 500 problem+json and its writes are rolled back', async () => {
      const id = randomUUID();
      const first = await call(app.url, '/boom', { headers: { 'x-test-id': id } });
      assertProblem(first, 500);
      const second = await call(app.url, '/boom', { headers: { 'x-test-id': id } });
      assert.equal(second.status, 200);
      assert.equal(second.json().attempt, null);
      assert.equal(Number((await pool.query('SELECT count(*) FROM items WHERE nonce = $1', [id])).rows[0].count), 1);
    });

    test('a key of 256 characters gets 400 problem+json; 255 are accepted', async () => {
      const id = randomUUID();
      assertProblem(await call(app.url, '/items/1', { key: 'k'.repeat(256), headers: { 'x-test-id': id } }), 400);
      assert.equal(app.counts.get(`item:${id}`), undefined);
      assert.equal((await call(app.url, '/items/1', { key: `${randomUUID()}${'k'.repeat(219)}` })).status, 201);
    });

    test('the same key with another body gets 422 problem+json and runs nothing', async () => {
      const key = randomUUID();
      const id = randomUUID();
      assert.equal((await call(app.url, '/items/1', { key, headers: { 'x-test-id': id }, body: { a: 1 } })).status, 201);
      assertProblem(await call(app.url, '/items/1', { key, headers: { 'x-test-id': id }, body: { a: 2 } }), 422);
      assert.equal(app.counts.get(`item:${id}`), 1);
    });

    test('tenants are apart: the same key of another tenant executes again', async () => {
      const key = randomUUID();
      const a = await call(app.url, '/items/1', { key });
      const b = await call(app.url, '/items/1', { key, headers: { 'x-tenant': 'globex' } });
      assert.equal(b.status, 201);
      assert.equal(b.replayed, false);
      assert.notDeepEqual(a.bytes, b.bytes);
    });

    test('a concurrent duplicate gets 409 problem+json with Retry-After; after the first finishes, the replay', async () => {
      const key = randomUUID();
      const gate = randomUUID();
      const first = call(app.url, '/items/1', { key, headers: { 'x-gate': gate } });
      await gates.get(gate).reached;
      const dup = await call(app.url, '/items/1', { key, headers: { 'x-gate': gate } });
      assertProblem(dup, 409);
      assert.equal(dup.headers.get('retry-after'), '1');
      gates.get(gate).open();
      const done = await first;
      assert.equal(done.status, 201);
      const again = await call(app.url, '/items/1', { key });
      assert.equal(again.replayed, true);
      assert.deepEqual(again.bytes, done.bytes);
    });

    test('wait mode: a concurrent duplicate waits for the first and gets its replay', async () => {
      const key = randomUUID();
      const gate = randomUUID();
      const id = randomUUID();
      const first = call(app.url, '/wait/items/1', { key, headers: { 'x-gate': gate, 'x-test-id': id } });
      await gates.get(gate).reached;
      const before = await waitingClaims();
      const dup = call(app.url, '/wait/items/1', { key, headers: { 'x-gate': gate, 'x-test-id': id } });
      await until(async () => (await waitingClaims()) > before, 'the duplicate to wait for the claim');
      gates.get(gate).open();
      const [a, b] = await Promise.all([first, dup]);
      assert.equal(a.status, 201);
      assert.equal(a.replayed, false);
      assert.equal(b.status, 201);
      assert.equal(b.replayed, true);
      assert.deepEqual(b.bytes, a.bytes);
      assert.equal(app.counts.get(`item:${id}`), 1);
    });

    test('a handler that throws: 500, its writes rolled back, and the retry runs it again', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/boom', { key, headers: { 'x-test-id': id } });
      assertProblem(first, 500);
      assert.equal(first.replayed, false);
      const rec = await stored('POST /boom', key);
      assert.equal(rec.state, 'failed');
      assert.equal(Number((await pool.query('SELECT count(*) FROM items WHERE idem_key = $1', [key])).rows[0].count), 0);
      const retry = await call(app.url, '/boom', { key, headers: { 'x-test-id': id } });
      assert.equal(retry.status, 200);
      assert.equal(retry.replayed, false);
      assert.equal(retry.json().attempt, rec.attempt + 1);
      assert.equal(app.counts.get(`boom:${id}`), 2);
      assert.equal(Number((await pool.query('SELECT count(*) FROM items WHERE idem_key = $1', [key])).rows[0].count), 1);
    });

    test('a business error (a thrown 402) is answered as problem+json, stored and replayed', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/declined', { key, headers: { 'x-test-id': id } });
      assertProblem(first, 402);
      assert.equal(first.json().detail, 'card declined');
      const again = await call(app.url, '/declined', { key, headers: { 'x-test-id': id } });
      assert.equal(again.status, 402);
      assert.equal(again.replayed, true);
      assert.deepEqual(again.bytes, first.bytes);
      assert.equal(app.counts.get(`declined:${id}`), 1);
      assert.equal((await stored('POST /declined', key)).state, 'failed');
    });

    test('a response too large to store: logged with its SQLSTATE, a final 500 problem+json, replayed to the retry', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/big', { key, headers: { 'x-test-id': id } });
      assertProblem(first, 500);
      assert.equal(first.json().code, 'idempotency-store-failed');
      assert.match(first.json().detail, /SQLSTATE 54000/);
      assert.equal(first.headers.get('retry-after'), null);
      assert.deepEqual(app.errors.filter((e) => e.key === key).map((e) => e.err.code), ['54000']);
      const retry = await call(app.url, '/big', { key, headers: { 'x-test-id': id } });
      assert.equal(retry.replayed, true);
      assert.equal(retry.status, 500);
      assert.deepEqual(retry.bytes, first.bytes);
      assert.equal(app.counts.get(`big:${id}`), 1);
      const rec = await stored('POST /big', key);
      assert.equal(rec.state, 'failed');
      assert.equal(Number((await pool.query('SELECT count(*) FROM items WHERE idem_key = $1', [key])).rows[0].count), 0);
    });

    test('a commit that fails but may pass (40001): 503 problem+json with Retry-After, and the retry runs again', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/flaky', { key, headers: { 'x-test-id': id } });
      assertProblem(first, 503);
      assert.equal(first.headers.get('retry-after'), '1');
      assert.deepEqual(app.errors.filter((e) => e.key === key).map((e) => e.err.code), ['40001']);
      const retry = await call(app.url, '/flaky', { key, headers: { 'x-test-id': id } });
      assert.equal(retry.status, 200);
      assert.equal(String(retry.bytes), 'run 2');
      assert.equal((await stored('POST /flaky', key)).state, 'succeeded');
    });

    test('a client that disconnects does not abort the handler: its retry gets the stored response', async () => {
      const key = randomUUID();
      const gate = randomUUID();
      const id = randomUUID();
      const abort = new AbortController();
      const first = call(app.url, '/items/1', { key, headers: { 'x-gate': gate, 'x-test-id': id }, signal: abort.signal })
        .then(() => 'answered', (e) => e.name);
      await gates.get(gate).reached;
      abort.abort();
      assert.equal(await first, 'AbortError');
      gates.get(gate).open();
      const retry = await until(async () => {
        const r = await call(app.url, '/items/1', { key, headers: { 'x-test-id': id } });
        return r.status === 409 ? null : r;
      }, 'the first attempt to finish');
      assert.equal(retry.status, 201);
      assert.equal(retry.replayed, true);
      assert.ok(retry.bytes.length > 0);
      const { rows: [row] } = await pool.query('SELECT nonce FROM items WHERE idem_key = $1', [key]);
      assert.equal(retry.json().nonce, row.nonce);
      assert.equal(app.counts.get(`item:${id}`), 1);
    });

    test('ordering: a retry sent the instant the first response arrives gets the replay, not 409', async () => {
      const key = randomUUID();
      const first = await call(app.url, '/slow-commit', { key });
      const retry = await call(app.url, '/slow-commit', { key });
      assert.equal(first.status, 200);
      assert.equal(retry.status, 200, `the retry got ${retry.status}: the response was sent before it was stored`);
      assert.equal(retry.replayed, true);
      assert.deepEqual(retry.bytes, first.bytes);
    });
  });
}

describe('Express 4', () => {
  test('handler() answers what an async handler rejects with: Express 4 ignores the promise', async (t) => {
    assert.match(require('express/package.json').version, /^4\./, 'these are Express 4 semantics');
    const expressLib = require('express');
    const idem = require('..');
    const unhandled = [];
    const onUnhandled = (reason) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    t.after(() => process.off('unhandledRejection', onUnhandled));
    const idempotent = idem.express({ pool, tenant: 'acme', onError: () => {} });
    const app = expressLib();
    const reject = async () => { await Promise.resolve(); throw new Error('rejected'); };
    app.post('/reject', expressLib.json(), idempotent, idempotent.handler(reject));
    app.post('/bare', expressLib.json(), idempotent.handler(reject));
    const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
    t.after(() => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }));
    const url = `http://127.0.0.1:${server.address().port}`;
    const key = randomUUID();
    assertProblem(await call(url, '/reject', { key }), 500);
    assert.equal((await stored('POST /reject', key)).state, 'failed');
    assertProblem(await call(url, '/reject'), 500);
    assertProblem(await call(url, '/bare'), 500);
    assert.deepEqual(unhandled, []);
  });
});

describe('store failures are logged by default, with the key and the SQLSTATE', () => {
  const idem = require('..');
  const big = 'x'.repeat(1024 * 1024 + 1);

  test('fastify: request.log', async (t) => {
    const lines = [];
    const app = require('fastify')({ logger: { level: 'error', stream: { write: (line) => lines.push(JSON.parse(line)) } } });
    await app.register(idem.fastify, { pool, tenant: 'acme' });
    app.post('/big', async () => big);
    t.after(() => app.close());
    const key = randomUUID();
    const r = await app.inject({ method: 'POST', url: '/big', headers: { 'idempotency-key': key }, payload: {} });
    assert.equal(r.statusCode, 500);
    const line = lines.find((l) => l.msg.includes(key));
    assert.ok(line, JSON.stringify(lines));
    assert.match(line.msg, /SQLSTATE 54000/);
    assert.equal(line.err.code, '54000');
  });

  test('Express: console.error', async (t) => {
    const expressLib = require('express');
    const logged = [];
    t.mock.method(console, 'error', (...args) => { logged.push(args.join(' ')); });
    const idempotent = idem.express({ pool, tenant: 'acme' });
    const app = expressLib();
    app.post('/big', expressLib.json(), idempotent, idempotent.handler(async (req, res) => { res.send(big); }));
    const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
    t.after(() => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }));
    const key = randomUUID();
    assertProblem(await call(`http://127.0.0.1:${server.address().port}`, '/big', { key }), 500);
    assert.equal(logged.length, 1, logged.join('\n'));
    assert.match(logged[0], new RegExp(`POST /big key ${key}: storing the response failed: SQLSTATE 54000: `));
  });
});
