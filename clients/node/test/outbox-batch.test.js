// The dispatcher finishes a take's successful deliveries with one
// idem_delivered_many call; retries and deaths stay per message.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { enqueue, createDispatcher } = require('..');
const { setupDatabase, newPool, randomUUID, until } = require('./support');

const pool = newPool();
before(() => setupDatabase(pool));
after(() => pool.end());

/** The pool, with every statement the dispatcher sends kept in `sql`. */
function spied() {
  const sql = [];
  return {
    sql,
    pool: {
      query: (text, values) => { sql.push(text); return pool.query(text, values); },
      connect: () => pool.connect(),
    },
  };
}

const silent = { info() {}, warn() {}, error() {} };

async function put(topic, keys) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    for (const key of keys) await enqueue(client, { tenant: 'acme', topic, key, payload: { key } });
    await client.query('COMMIT');
  } finally {
    client.release();
  }
}

const states = async (topic, keys) => Promise.all(keys.map(async (key) => (
  await pool.query('SELECT state, status, attempt, body FROM idem_message($1, $2, $3)', ['acme', topic, key])).rows[0]));

test('a batch of deliveries without a body: one idem_delivered_many; a 503 and a 404 per message', async (t) => {
  const topic = `batch-${randomUUID()}`;
  const keys = ['a', 'b', 'c', 'retry', 'dead'];
  await put(topic, keys);
  const { sql, pool: spy } = spied();
  const d = createDispatcher({
    pool: spy, topic, concurrency: 5, batchSize: 5, pollInterval: 100, logger: silent,
    handler: async (m) => {
      const { key } = JSON.parse(m.payload);
      if (key === 'retry') return m.attempt === 1 ? { status: 503, retryAfter: 0 } : { status: 202 };
      if (key === 'dead') return { status: 404 };
      return { status: 204 };
    },
  });
  t.after(() => d.stop());
  await d.start();
  await until(async () => (await states(topic, keys)).every((m) => m && ['delivered', 'dead'].includes(m.state)), 'the batch');
  const rows = await states(topic, keys);
  assert.deepEqual(rows.map((m) => [m.state, m.status]),
    [['delivered', 204], ['delivered', 204], ['delivered', 204], ['delivered', 202], ['dead', null]]);
  const count = (fn) => sql.filter((s) => s.includes(`${fn}(`)).length;
  assert.equal(count('idem_delivered'), 0, 'no delivery recorded by itself');
  assert.ok(count('idem_delivered_many') >= 2 && count('idem_delivered_many') <= 3, sql.join('\n'));
  assert.equal(count('idem_retry'), 1);
  assert.equal(count('idem_dead'), 1);
});

test('answers with and without a body: one idem_delivered_many keeps each body', async (t) => {
  const topic = `batch-${randomUUID()}`;
  const keys = ['x', 'y'];
  await put(topic, keys);
  const { sql, pool: spy } = spied();
  const d = createDispatcher({
    pool: spy, topic, concurrency: 2, pollInterval: 100, logger: silent,
    handler: async (m) => (JSON.parse(m.payload).key === 'x' ? { status: 200, body: 'receipt x' } : { status: 200 }),
  });
  t.after(() => d.stop());
  await d.start();
  await until(async () => (await states(topic, keys)).every((m) => m && m.state === 'delivered'), 'both delivered');
  const [x, y] = await states(topic, keys);
  assert.equal(String(x.body), 'receipt x');
  assert.equal(y.body, null);
  assert.equal(sql.filter((s) => s.includes('idem_delivered(')).length, 0);
  assert.equal(sql.filter((s) => s.includes('idem_delivered_many(')).length, 1);
});
