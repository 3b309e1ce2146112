// withIdempotency: the same guarantees for code that is not an HTTP handler.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { withIdempotency, IdemError } = require('..');
const { setupDatabase, newPool, randomUUID } = require('./support');

const pool = newPool();
before(() => setupDatabase(pool));
after(() => pool.end());

const scope = (key, extra = {}) => ({ tenant: 'acme', endpoint: 'job:invoice', key, ...extra });
const rows = async (key) => Number((await pool.query('SELECT count(*) FROM items WHERE idem_key = $1', [key])).rows[0].count);

test('claimed runs fn in the claim\'s transaction; a second call replays the stored bytes', async () => {
  const key = randomUUID();
  let runs = 0;
  const fn = async (client) => {
    runs += 1;
    await client.query(`INSERT INTO items (app, idem_key, nonce) VALUES ('with', $1, $2)`, [key, randomUUID()]);
    return { status: 201, headers: { 'Content-Type': 'application/json' }, body: { run: runs, key } };
  };
  const first = await withIdempotency(pool, scope(key, { fingerprint: { a: 1, b: 2 } }), fn);
  assert.equal(first.outcome, 'claimed');
  assert.equal(first.replayed, false);
  assert.equal(first.status, 201);
  const again = await withIdempotency(pool, scope(key, { fingerprint: { b: 2, a: 1 } }), fn);
  assert.equal(again.outcome, 'replay');
  assert.equal(again.replayed, true);
  assert.equal(again.status, 201);
  assert.deepEqual(again.body, first.body);
  assert.deepEqual(JSON.parse(again.body), { run: 1, key });
  assert.deepEqual(again.headers, { 'Content-Type': 'application/json' });
  assert.equal(runs, 1);
  assert.equal(await rows(key), 1);
});

test('a key held by an uncommitted claim: IdemError in_progress, fn not run', async () => {
  const key = randomUUID();
  const holder = await pool.connect();
  try {
    await holder.query('BEGIN');
    await holder.query(`SELECT idem_claim('acme', 'job:invoice', $1)`, [key]);
    await assert.rejects(withIdempotency(pool, scope(key), async () => assert.fail('fn ran')),
      (e) => e instanceof IdemError && e.outcome === 'in_progress' && e.statusCode === 409);
  } finally {
    await holder.query('ROLLBACK');
    holder.release();
  }
});

test('another fingerprint under a used key: IdemError mismatch', async () => {
  const key = randomUUID();
  await withIdempotency(pool, scope(key, { fingerprint: 'one' }), async () => ({ status: 200, body: 'x' }));
  await assert.rejects(withIdempotency(pool, scope(key, { fingerprint: 'two' }), async () => assert.fail('fn ran')),
    (e) => e instanceof IdemError && e.outcome === 'mismatch' && e.statusCode === 422);
});

test('fn throws: its writes roll back, the error comes through, and the next call runs fn again', async () => {
  const key = randomUUID();
  const boom = new Error('boom');
  await assert.rejects(withIdempotency(pool, scope(key), async (client) => {
    await client.query(`INSERT INTO items (app, idem_key, nonce) VALUES ('with', $1, 'x')`, [key]);
    throw boom;
  }), (e) => e === boom);
  assert.equal(await rows(key), 0);
  // the failed attempt's number: a key's first attempt starts above the
  // fencing floor of its bucket, which other keys' purges may have raised
  const { rows: [failed] } = await pool.query(
    `SELECT state, attempt FROM idem_list('acme', 'job:invoice', max_rows => 100000) WHERE key = $1`, [key]);
  assert.equal(failed.state, 'failed');
  const second = await withIdempotency(pool, scope(key), async () => ({ status: 200, body: Buffer.from([0, 1, 2]) }));
  assert.equal(second.outcome, 'claimed');
  assert.equal(second.attempt, failed.attempt + 1);
  const third = await withIdempotency(pool, scope(key), async () => assert.fail('fn ran'));
  assert.deepEqual(third.body, Buffer.from([0, 1, 2]));
});

test('a 4xx result is a business failure: stored and replayed', async () => {
  const key = randomUUID();
  await withIdempotency(pool, scope(key), async () => ({ status: 402, body: 'declined' }));
  const again = await withIdempotency(pool, scope(key), async () => assert.fail('fn ran'));
  assert.equal(again.status, 402);
  assert.equal(String(again.body), 'declined');
  const { rows: [rec] } = await pool.query(
    `SELECT state FROM idem_list('acme', 'job:invoice', max_rows => 100000) WHERE key = $1`, [key]);
  assert.equal(rec.state, 'failed');
});
