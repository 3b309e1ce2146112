// Shared by the tests: a database with idem (PGHOST, PGPORT, PGDATABASE,
// PGUSER as a superuser), and the two example apps, one per framework, with
// the same routes.
'use strict';

const { randomUUID } = require('node:crypto');
const http = require('node:http');
const { Pool } = require('pg');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function setupDatabase(pool) {
  await pool.query(`
    CREATE EXTENSION IF NOT EXISTS idem;
    CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY, app text NOT NULL, idem_key text,
                                      nonce text NOT NULL);
    CREATE TABLE IF NOT EXISTS slow_commit (id serial PRIMARY KEY);
    CREATE OR REPLACE FUNCTION slow_commit_trigger() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
    -- a commit that fails with a serialization failure (40001) when the row asks for it
    CREATE TABLE IF NOT EXISTS flaky (id serial PRIMARY KEY, fail boolean NOT NULL);
    CREATE OR REPLACE FUNCTION flaky_trigger() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN IF NEW.fail THEN RAISE EXCEPTION 'flaky commit' USING ERRCODE = '40001'; END IF; RETURN NULL; END $$;
    DO $$ BEGIN
      CREATE CONSTRAINT TRIGGER flaky AFTER INSERT ON flaky
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION flaky_trigger();
    EXCEPTION WHEN duplicate_object THEN NULL; END $$;
    DO $$ BEGIN
      CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commit
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_trigger();
    EXCEPTION WHEN duplicate_object THEN NULL; END $$;
  `);
}

/** A gate a handler waits at until the test opens it. */
class Gates {
  constructor() { this.gates = new Map(); }
  get(name) {
    if (!this.gates.has(name)) {
      let open;
      let arrived;
      const g = { opened: new Promise((r) => { open = r; }), reached: new Promise((r) => { arrived = r; }) };
      g.open = open;
      g.arrive = arrived;
      this.gates.set(name, g);
    }
    return this.gates.get(name);
  }
}

/** The work of every route, whichever framework calls it. */
function routes(app, gates) {
  const counts = new Map();
  const bump = (name) => { counts.set(name, (counts.get(name) || 0) + 1); return counts.get(name); };
  return {
    counts,
    // POST /items/:id: a row in the request's transaction, a 201 with Location
    async item({ idem, params, headers }) {
      bump(`item:${headers['x-test-id']}`);
      const gate = headers['x-gate'];
      if (gate) {
        gates.get(gate).arrive();
        await gates.get(gate).opened;
      }
      const nonce = randomUUID();
      const { rows: [row] } = await idem.client.query(
        'INSERT INTO items (app, idem_key, nonce) VALUES ($1, $2, $3) RETURNING id', [app, idem.key, nonce]);
      return {
        status: 201,
        headers: { 'Content-Type': 'application/json', Location: `/items/${params.id}/${row.id}` },
        body: JSON.stringify({ id: row.id, nonce, outcome: idem.outcome, key: idem.key, attempt: idem.attempt }),
      };
    },
    // POST /boom: writes, then throws (the first time per test id only)
    async boom({ idem, headers }) {
      const n = bump(`boom:${headers['x-test-id']}`);
      await idem.client.query('INSERT INTO items (app, idem_key, nonce) VALUES ($1, $2, $3)',
        [app, idem.key, headers['x-test-id'] || 'boom']);
      if (n === 1) throw new Error('the database went away');
      return { status: 200, headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ n, attempt: idem.attempt }) };
    },
    // POST /declined: a business failure, thrown with a 4xx
    async declined({ headers }) {
      bump(`declined:${headers['x-test-id']}`);
      const e = new Error('card declined');
      e.statusCode = 402;
      throw e;
    },
    // POST /slow-commit: the claim's transaction takes 0.5 s to commit
    async slowCommit({ idem }) {
      await idem.client.query('INSERT INTO slow_commit DEFAULT VALUES');
      return { status: 200, headers: { 'Content-Type': 'text/plain' }, body: `done ${randomUUID()}` };
    },
    // POST /flaky: the first commit (per test id) fails with a serialization failure
    async flaky({ idem, headers }) {
      const n = bump(`flaky:${headers['x-test-id']}`);
      await idem.client.query('INSERT INTO flaky (fail) VALUES ($1)', [n === 1]);
      return { status: 200, headers: { 'Content-Type': 'text/plain' }, body: `run ${n}` };
    },
    // POST /big: writes, then answers one byte more than idem.max_body_size (1MB) allows
    async big({ idem, headers }) {
      bump(`big:${headers['x-test-id']}`);
      await idem.client.query('INSERT INTO items (app, idem_key, nonce) VALUES ($1, $2, $3)', [app, idem.key, 'big']);
      return { status: 200, headers: { 'Content-Type': 'text/plain' }, body: 'x'.repeat(1024 * 1024 + 1) };
    },
  };
}

/** One HTTP call; `signal` to disconnect. */
async function call(base, path, { key, body = { a: 1 }, headers = {}, signal } = {}) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  return {
    status: res.status, headers: res.headers, bytes, replayed: res.headers.get('idempotent-replayed') === 'true',
    json: () => JSON.parse(bytes),
  };
}

/** Until fn() is truthy; bounded (a generous bound, not a timing claim). */
async function until(fn, what, ms = 30000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await sleep(50);
  }
}

/**
 * An HTTP receiver on a free port: `answer(request, body)` gives
 * `{status, headers, body}` (or a promise of it); every request is kept in
 * `requests` with its headers, body bytes and arrival time.
 */
async function receiver(answer) {
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const request = { headers: req.headers, body: Buffer.concat(chunks), at: Date.now() };
      requests.push(request);
      const a = await answer(request);
      res.writeHead(a.status, a.headers || {});
      res.end(a.body ?? '');
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/hook`,
    requests,
    close: () => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    },
  };
}

function newPool() {
  return new Pool({ max: 20 });
}

module.exports = { setupDatabase, Gates, routes, call, until, sleep, newPool, randomUUID, receiver };
