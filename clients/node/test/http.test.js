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
      assert.equal(first.json().idem, true);
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

    test('not required: a request without a key runs the handler without idem, every time', async () => {
      const id = randomUUID();
      const a = await call(app.url, '/items/1', { headers: { 'x-test-id': id } });
      const b = await call(app.url, '/items/1', { headers: { 'x-test-id': id } });
      assert.equal(a.status, 201);
      assert.equal(a.json().idem, false);
      assert.equal(b.replayed, false);
      assert.notDeepEqual(a.bytes, b.bytes);
      assert.equal(app.counts.get(`item:${id}`), 2);
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
      assert.equal(first.status, 500);
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

    test('a business error (a thrown 402) is stored and replayed', async () => {
      const key = randomUUID();
      const id = randomUUID();
      const first = await call(app.url, '/declined', { key, headers: { 'x-test-id': id } });
      assert.equal(first.status, 402);
      const again = await call(app.url, '/declined', { key, headers: { 'x-test-id': id } });
      assert.equal(again.status, 402);
      assert.equal(again.replayed, true);
      assert.deepEqual(again.bytes, first.bytes);
      assert.equal(app.counts.get(`declined:${id}`), 1);
      assert.equal((await stored('POST /declined', key)).state, 'failed');
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
