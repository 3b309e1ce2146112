// The extension in a schema of its own (CREATE EXTENSION idem SCHEMA ...),
// not on the search_path: every call of the package names the schema given
// by its `schema` option.  An extension lives once per database: this test
// makes a database of its own, and drops it.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Pool } = require('pg');
const Fastify = require('fastify');
const expressLib = require('express');
const idem = require('..');
const { call, until, randomUUID } = require('./support');

// a name that must be quoted as an identifier: upper case and a space
const schema = 'Idem Api';
const database = `pg_idem_schema_${process.pid}`;
const admin = new Pool({ max: 1 });
let pool;

before(async () => {
  await admin.query(`CREATE DATABASE ${database}`);
  pool = new Pool({ database, max: 10 });
  await pool.query(`CREATE SCHEMA "${schema}"; CREATE EXTENSION idem SCHEMA "${schema}";
                    CREATE TABLE orders (id serial PRIMARY KEY, key text)`);
});
after(async () => {
  await pool.end();
  // not WITH (FORCE): pool.end() resolves before its connections have
  // closed, and a connection the server terminates emits an error nobody
  // listens to any longer; a plain DROP waits (5 s) for them to go
  await admin.query(`DROP DATABASE ${database}`);
  await admin.end();
});

const run = (key, extra = {}) => idem.withIdempotency(pool, { tenant: 'acme', endpoint: 'job', key, ...extra },
  async (client) => {
    await client.query('INSERT INTO orders (key) VALUES ($1)', [key]);
    return { status: 200, body: key };
  });

test('the extension is not on the search_path: without the option, 42883', async () => {
  await assert.rejects(run(randomUUID()), (e) => e.code === '42883');
});

test('withIdempotency', async () => {
  const key = randomUUID();
  assert.equal((await run(key, { schema })).outcome, 'claimed');
  assert.equal((await run(key, { schema })).outcome, 'replay');
});

test('the fastify plugin and the Express middleware', async (t) => {
  const order = async (db, key) => {
    const { rows: [row] } = await db.query('INSERT INTO orders (key) VALUES ($1) RETURNING id', [key]);
    return row;
  };
  const f = Fastify();
  await f.register(idem.fastify, { pool, tenant: 'acme', schema });
  f.post('/orders', async (request, reply) => reply.code(201).send(await order(request.idem.client, request.idem.key)));
  const e = expressLib();
  const idempotent = idem.express({ pool, tenant: 'acme', schema });
  e.post('/orders', expressLib.json(), idempotent, idempotent.handler(async (req, res) => {
    res.status(201).json(await order(req.idem.client, req.idem.key));
  }));
  const server = await new Promise((resolve) => { const s = e.listen(0, '127.0.0.1', () => resolve(s)); });
  t.after(() => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }));
  t.after(() => f.close());
  for (const url of [await f.listen({ port: 0, host: '127.0.0.1' }), `http://127.0.0.1:${server.address().port}`]) {
    const key = randomUUID();
    const first = await call(url, '/orders', { key });
    assert.equal(first.status, 201, String(first.bytes));
    const again = await call(url, '/orders', { key });
    assert.equal(again.replayed, true);
    assert.deepEqual(again.bytes, first.bytes);
    // a request that claims nothing makes no call of idem: it worked before the option too
    assert.equal((await call(url, '/orders')).status, 201);
  }
});

test('enqueue and the dispatcher', async () => {
  const key = randomUUID();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const e = await idem.enqueue(client, { tenant: 'acme', topic: 'billing', key, payload: { key }, schema });
    assert.equal(e.outcome, 'enqueued');
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  const delivered = [];
  const silent = { info() {}, warn() {}, error() {} };
  const dispatcher = idem.createDispatcher({
    pool, topic: 'billing', schema, logger: silent, pollInterval: 50, handler: (m) => { delivered.push(m.key); },
  });
  await dispatcher.start();
  try {
    await until(async () => (await pool.query(`SELECT state FROM "${schema}".idem_message('acme', 'billing', $1)`, [key]))
      .rows[0].state === 'delivered', 'the message to be delivered');
  } finally {
    await dispatcher.stop();
  }
  assert.deepEqual(delivered, [key]);
});
