// test/http/e2e.test.js: end-to-end tests of the example service with a
// real HTTP client that times out and retries.  Needs a PostgreSQL server
// with idem (PGHOST, PGPORT, PGUSER as a superuser, PGDATABASE), as
// test/run.sh provides.  Run with: node --test e2e.test.js
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const path = require('node:path');
const { Client } = require('pg');
const { fingerprint } = require('pg-idem');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let db;
let provider;
let service;

// start a node script; resolves once it prints the port it listens on
function start(script, env) {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, [path.join(__dirname, script)], {
      env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'],
    });
    proc.stdout.on('data', (chunk) => {
      const m = /listening on .*?(\d+)\s*$/m.exec(String(chunk));
      if (m) resolve({ proc, url: `http://127.0.0.1:${m[1]}` });
    });
    proc.on('exit', (code) => reject(new Error(`${script} exited with ${code}`)));
  });
}

// The payment lease (2 s) is longer than the provider's slowest answer
// (1.2 s below): the rule that makes "unknown" mean "the worker is gone".
function startService() {
  return start('service.js', { PROVIDER_URL: provider.url, PAYMENT_LEASE: '2 seconds', ORDER_WORK_MS: '300' });
}

// One HTTP call with a client timeout; a timeout is an answer too
async function post(route, { key, body, token = 'token-acme', timeoutMs = 5000, headers = {} }) {
  try {
    const res = await fetch(`${service.url}${route}`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        ...(key ? { 'idempotency-key': key } : {}),
        ...headers,
      },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true',
      retryAfter: res.headers.get('retry-after'), location: res.headers.get('location'),
      contentType: res.headers.get('content-type'), bytes: Buffer.from(await res.arrayBuffer()) };
  } catch (e) {
    if (e.name === 'TimeoutError' || e.name === 'AbortError' || e.cause) return { status: 'timeout' };
    throw e;
  }
}

// The client's retry loop: the key is generated once, before the loop
async function untilAnswered(route, opts, tries = 100) {
  const seen = [];
  for (let i = 0; i < tries; i++) {
    const r = await post(route, opts);
    seen.push(r.status);
    if (r.status !== 'timeout' && r.status !== 409 && r.status !== 502) return { ...r, seen };
    await sleep(100);
  }
  throw new Error(`no final answer after ${tries} tries: ${seen.join(',')}`);
}

const count = async (sql, args) => Number((await db.query(sql, args)).rows[0].count);

before(async () => {
  db = new Client();
  await db.connect();
  await db.query(`
    DROP TABLE IF EXISTS orders;
    DROP EXTENSION IF EXISTS idem;
    CREATE EXTENSION idem;
    CREATE TABLE orders (id serial PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL,
                         item text NOT NULL, qty int NOT NULL);
  `);
  for (const t of ['acme', 'globex']) {
    await db.query(`DO $$ BEGIN CREATE ROLE idem_app_${t} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`);
    await db.query(`SELECT idem_bind('idem_app_${t}', '${t}')`);
    await db.query(`GRANT SELECT, INSERT ON orders TO idem_app_${t}; GRANT USAGE ON SEQUENCE orders_id_seq TO idem_app_${t}`);
  }
  provider = await start('provider.js', { DROP_EVERY: '3', PROVIDER_DELAY_MS: '150' });
  service = await startService();
});

after(async () => {
  service.proc.kill('SIGKILL');
  provider.proc.kill('SIGKILL');
  await db.end();
});

test('a request without an Idempotency-Key is refused with 400', async () => {
  const r = await post('/v1/orders', { body: { item: 'book' } });
  assert.equal(r.status, 400);
});

test('a key longer than idem accepts (255 bytes) is refused with 400 by pg-idem', async () => {
  const r = await post('/v1/orders', { key: 'k'.repeat(256), body: { item: 'book' } });
  assert.equal(r.status, 400);
});

test('a replay gives back the stored headers: the Location of a 201 and its Content-Type', async () => {
  const key = randomUUID();
  const first = await post('/v1/orders', { key, body: { item: 'map' } });
  assert.equal(first.status, 201);
  assert.equal(first.replayed, false);
  assert.match(first.location, /^\/v1\/orders\/\d+$/);
  assert.equal(first.contentType, 'application/json');
  const { id } = JSON.parse(first.bytes);
  assert.equal(first.location, `/v1/orders/${id}`);
  const again = await post('/v1/orders', { key, body: { item: 'map' } });
  assert.equal(again.status, 201);
  assert.equal(again.replayed, true);
  assert.equal(again.location, first.location);
  assert.equal(again.contentType, 'application/json');
  assert.deepEqual(again.bytes, first.bytes);
  const { rows: [rec] } = await db.query(
    `SELECT headers FROM idem_list('acme', 'POST /v1/orders', true, 100000) WHERE key = $1`, [key]);
  // fastify keeps header names in lower case; HTTP compares them without case
  const stored = Object.fromEntries(Object.entries(rec.headers).map(([k, v]) => [k.toLowerCase(), v]));
  assert.deepEqual(stored, { 'content-type': 'application/json', location: first.location });
});

test('a client that times out retries with one key: one order, and replays are byte-identical', async () => {
  const key = randomUUID();
  const body = { item: 'book', qty: 2 };
  const final = await untilAnswered('/v1/orders', { key, body, timeoutMs: 100 });
  assert.equal(final.status, 201);
  assert.ok(final.seen.includes('timeout'), 'the client timed out before the work was done');
  const again = await post('/v1/orders', { key, body: { qty: 2, item: 'book' } });
  assert.equal(again.status, 201);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.bytes, final.bytes);
  assert.equal(await count('SELECT count(*) FROM orders WHERE idem_key = $1', [key]), 1);
});

test('concurrent duplicates: one executes, the others get 409 or the replay', async () => {
  const key = randomUUID();
  const answers = await Promise.all(Array.from({ length: 8 }, () => post('/v1/orders', { key, body: { item: 'lamp' } })));
  const executed = answers.filter((r) => r.status === 201 && !r.replayed);
  assert.equal(executed.length, 1, `answers: ${answers.map((r) => r.status).join(',')}`);
  for (const r of answers.filter((a) => a !== executed[0])) {
    assert.ok(r.status === 409 || (r.status === 201 && r.replayed), `got ${r.status}`);
    if (r.status === 409) assert.equal(r.retryAfter, '1');
    if (r.replayed) assert.deepEqual(r.bytes, executed[0].bytes);
  }
  assert.equal(await count('SELECT count(*) FROM orders WHERE idem_key = $1', [key]), 1);
});

test('the same key with a changed body is refused with 422 and executes nothing', async () => {
  const key = randomUUID();
  assert.equal((await post('/v1/orders', { key, body: { item: 'pen', qty: 1 } })).status, 201);
  assert.equal((await post('/v1/orders', { key, body: { item: 'pen', qty: 5 } })).status, 422);
  assert.equal(await count('SELECT count(*) FROM orders WHERE idem_key = $1', [key]), 1);
});

test('tenants are apart: the same key of another tenant is another request', async () => {
  const key = randomUUID();
  const acme = await post('/v1/orders', { key, body: { item: 'cup' } });
  const globex = await post('/v1/orders', { key, body: { item: 'cup' }, token: 'token-globex' });
  assert.equal(acme.status, 201);
  assert.equal(globex.status, 201);
  assert.equal(globex.replayed, false);
  assert.notDeepEqual(globex.bytes, acme.bytes);
  assert.equal(await count('SELECT count(*) FROM orders WHERE idem_key = $1', [key]), 2);
});

test('payments through a provider that drops replies: exactly one charge per key', async () => {
  const keys = Array.from({ length: 6 }, () => randomUUID());
  const finals = await Promise.all(keys.map((key) =>
    untilAnswered('/v1/payments', { key, body: { amount: 42 }, timeoutMs: 100 })));
  const charges = await (await fetch(`${provider.url}/stats`)).json();
  for (const [i, key] of keys.entries()) {
    assert.equal(finals[i].status, 201, `key ${i}: ${finals[i].seen.join(',')}`);
    assert.equal(charges[`acme:${key}`], 1, `key ${i} was charged once`);
    const again = await post('/v1/payments', { key, body: { amount: 42 } });
    assert.equal(again.replayed, true);
    assert.equal(again.contentType, 'application/json');
    assert.deepEqual(again.bytes, finals[i].bytes);
  }
  assert.ok(Object.keys(charges).length >= keys.length);
});

test('a declined card is a stored answer: 402, replayed without calling the provider again', async () => {
  const key = randomUUID();
  const first = await post('/v1/payments', { key, body: { amount: 5, card: 'declined' } });
  assert.equal(first.status, 402);
  assert.equal(first.replayed, false);
  const again = await post('/v1/payments', { key, body: { amount: 5, card: 'declined' } });
  assert.equal(again.status, 402);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.bytes, first.bytes);
  const calls = await (await fetch(`${provider.url}/calls`)).json();
  assert.equal(calls[`acme:${key}`], 1, 'the provider was asked once');
  const { rows: [rec] } = await db.query(
    `SELECT state, status, retryable FROM idem_record WHERE endpoint = 'POST /v1/payments' AND key = $1`, [key]);
  assert.deepEqual(rec, { state: 'failed', status: 402, retryable: false });
});

test('a provider 5xx is a retryable failure: not replayed, the retry calls the provider again', async () => {
  const key = randomUUID();
  const first = await post('/v1/payments', { key, body: { amount: 6, card: 'flaky' } });
  assert.equal(first.status, 503);
  assert.equal(first.retryAfter, '1');
  const { rows: [rec] } = await db.query(
    `SELECT state, retryable, attempt FROM idem_record WHERE endpoint = 'POST /v1/payments' AND key = $1`, [key]);
  assert.deepEqual(rec, { state: 'failed', retryable: true, attempt: 1 }, 'stored as retryable');
  const final = await untilAnswered('/v1/payments', { key, body: { amount: 6, card: 'flaky' }, timeoutMs: 1000 });
  assert.equal(final.status, 201, `answers: ${final.seen.join(',')}`);
  assert.equal(final.replayed, false);
  const { rows: [done] } = await db.query(
    `SELECT state, attempt FROM idem_record WHERE endpoint = 'POST /v1/payments' AND key = $1`, [key]);
  assert.deepEqual(done, { state: 'succeeded', attempt: 2 }, 'the retry ran as attempt 2');
  const calls = await (await fetch(`${provider.url}/calls`)).json();
  const charges = await (await fetch(`${provider.url}/stats`)).json();
  assert.equal(calls[`acme:${key}`], 2, 'the provider was asked again');
  assert.equal(charges[`acme:${key}`], 1, 'and charged once');
});

test('the service killed in the middle of a payment: the charge is reconciled, never repeated', async () => {
  const key = randomUUID();
  const first = await post('/v1/payments', {
    key, body: { amount: 7 }, timeoutMs: 200, headers: { 'x-provider-delay-ms': '1200' },
  });
  assert.equal(first.status, 'timeout');
  service.proc.kill('SIGKILL'); // the provider is still charging
  service = await startService();
  const final = await untilAnswered('/v1/payments', { key, body: { amount: 7 }, timeoutMs: 1000 });
  assert.equal(final.status, 201);
  assert.ok(final.seen.includes(409), 'retries were told the payment is in progress');
  const charges = await (await fetch(`${provider.url}/stats`)).json();
  assert.equal(charges[`acme:${key}`], 1);
});

test('a claim whose worker died before calling the provider is released and executed once', async () => {
  const key = randomUUID();
  // a worker claimed and committed, then died before the provider call
  const app = new Client({ user: 'idem_app_acme' });
  await app.connect();
  // with the fingerprint the plugin computes for that request
  await app.query(`SELECT idem_claim('acme', 'POST /v1/payments', $1, $2::bytea, lease => '1 second')`,
    [key, fingerprint('POST', '/v1/payments', { amount: 9 })]);
  await app.end();
  const final = await untilAnswered('/v1/payments', { key, body: { amount: 9 }, timeoutMs: 1000 });
  assert.equal(final.status, 201);
  const { rows: [rec] } = await db.query(
    `SELECT attempt FROM idem_list('acme', 'POST /v1/payments', max_rows => 100000) WHERE key = $1`, [key]);
  assert.equal(rec.attempt, 2, 'released by the reconciliation, then executed as attempt 2');
  const charges = await (await fetch(`${provider.url}/stats`)).json();
  assert.equal(charges[`acme:${key}`], 1);
});

test('the reconciliation settled every unknown payment', async () => {
  await sleep(2500);
  await fetch(`${service.url}/admin/reconcile`, { method: 'POST' });
  assert.equal(await count(`SELECT count(*) FROM idem_record WHERE endpoint = 'POST /v1/payments' AND state = 'pending'`), 0);
  const charges = await (await fetch(`${provider.url}/stats`)).json();
  assert.ok(Object.values(charges).every((n) => n === 1), `charges per key: ${JSON.stringify(charges)}`);
});
