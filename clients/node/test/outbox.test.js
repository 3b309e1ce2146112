// The outbox: enqueue in the caller's transaction, and the dispatcher in
// both modes (url: a real HTTP receiver; handler), its wake-up on
// notifications, its graceful stop and a stale lease.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { Pool } = require('pg');
const { enqueue, createDispatcher } = require('..');
const { setupDatabase, newPool, randomUUID, receiver, until, sleep } = require('./support');

const pool = newPool();
before(() => setupDatabase(pool));
after(() => pool.end());

const newTopic = () => `test-${randomUUID()}`;

/** The message's row of idem_message, or undefined. */
async function message(topic, key, tenant = 'acme') {
  const { rows } = await pool.query('SELECT * FROM idem_message($1, $2, $3)', [tenant, topic, key]);
  return rows[0];
}

/** Until the message is in one of `states`; its row. */
function settled(topic, key, states = ['delivered', 'dead']) {
  return until(async () => {
    const m = await message(topic, key);
    return m && states.includes(m.state) && m;
  }, `${key} ${states.join('/')}`);
}

/** A logger that keeps its lines. */
function memoryLogger() {
  const lines = [];
  const log = (level) => (text) => lines.push({ level, text });
  return { lines, info: log('info'), warn: log('warn'), error: log('error') };
}

/** Enqueue and commit (autocommit: one statement). */
function put(topic, key, payload, extra = {}) {
  return pool.connect().then(async (client) => {
    try {
      return await enqueue(client, { tenant: 'acme', topic, key, payload, ...extra });
    } finally {
      client.release();
    }
  });
}

test('enqueue: enqueued; the same payload again is a duplicate, another a mismatch; bytes, text and JSON', async () => {
  const topic = newTopic();
  const bytes = Buffer.from([0, 1, 2, 255]);
  const first = await put(topic, 'bytes', bytes, { headers: { 'x-a': 'b', 'x-list': ['1', '2'] } });
  assert.equal(first.outcome, 'enqueued');
  assert.equal(first.state, 'queued');
  assert.match(first.id, /^[0-9]+$/);
  assert.ok(first.createdAt instanceof Date);
  const again = await put(topic, 'bytes', Buffer.from(bytes));
  assert.deepEqual(again, { ...first, outcome: 'duplicate' });
  const other = await put(topic, 'bytes', Buffer.from([0, 1, 2, 254]));
  assert.equal(other.outcome, 'mismatch');
  assert.equal((await put(topic, 'text', 'héllo')).outcome, 'enqueued');
  assert.equal((await put(topic, 'text', 'héllo')).outcome, 'duplicate');
  assert.equal((await put(topic, 'json', { b: [1, 2], a: 'x' })).outcome, 'enqueued');
  assert.equal((await put(topic, 'json', { a: 'x', b: [1, 2] })).outcome, 'duplicate');
  assert.equal((await put(topic, 'json', { a: 'y', b: [1, 2] })).outcome, 'mismatch');

  const { rows } = await pool.query('SELECT key, payload, headers, attempt FROM idem_take($1, 10) ORDER BY key', [topic]);
  assert.deepEqual(rows.map((r) => r.key), ['bytes', 'json', 'text']);
  assert.deepEqual(rows[0].payload, bytes);
  assert.deepEqual(rows[0].headers, { 'x-a': 'b', 'x-list': ['1', '2'] });
  assert.deepEqual(JSON.parse(rows[1].payload), { a: 'x', b: [1, 2] });
  assert.equal(rows[2].payload.toString(), 'héllo');
  assert.deepEqual(rows.map((r) => r.attempt), [1, 1, 1]);
});

test('enqueue runs in the caller\'s transaction: a rollback leaves nothing, the key is free again', async () => {
  const topic = newTopic();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const inside = await enqueue(client, { tenant: 'acme', topic, key: 'k', payload: { n: 1 } });
    assert.equal(inside.outcome, 'enqueued');
    assert.equal((await message(topic, 'k')), undefined, 'not visible before the commit');
    await client.query('ROLLBACK');
    assert.equal((await message(topic, 'k')), undefined);
    const { rows } = await pool.query('SELECT * FROM idem_take($1, 10)', [topic]);
    assert.equal(rows.length, 0);
    assert.equal((await enqueue(client, { tenant: 'acme', topic, key: 'k', payload: { n: 2 } })).outcome, 'enqueued');
  } finally {
    client.release();
  }
});

test('enqueue passes notBefore, orderingKey, maxAttempts and redeliver to idem', async () => {
  const topic = newTopic();
  const later = new Date(Date.now() + 3600e3);
  await put(topic, 'later', 'x', { notBefore: later });
  assert.equal((await message(topic, 'later')).not_before.getTime(), later.getTime());
  await put(topic, 'o1', 'x', { orderingKey: 'customer-7' });
  await put(topic, 'o2', 'x', { orderingKey: 'customer-7', maxAttempts: 1 });
  let taken = (await pool.query('SELECT id, key, attempt FROM idem_take($1, 10)', [topic])).rows;
  assert.deepEqual(taken.map((r) => r.key), ['o1'], 'o2 waits for o1; "later" is not due');
  await pool.query('SELECT idem_delivered($1, $2)', [taken[0].id, taken[0].attempt]);
  taken = (await pool.query('SELECT id, key, attempt FROM idem_take($1, 10)', [topic])).rows;
  assert.deepEqual(taken.map((r) => r.key), ['o2']);
  const { rows: [{ state }] } = await pool.query('SELECT idem_retry($1, $2, $3) AS state', [taken[0].id, taken[0].attempt, 'failed']);
  assert.equal(state, 'dead', 'maxAttempts 1: one failed attempt is the last');

  await put(topic, 'once', 'x', { redeliver: false });
  taken = (await pool.query(`SELECT id FROM idem_take($1, 10, lease => '200 milliseconds')`, [topic])).rows;
  assert.equal(taken.length, 1);
  await sleep(400);
  assert.equal((await pool.query('SELECT count(*)::int AS n FROM idem_take($1, 10)', [topic])).rows[0].n, 0,
    'a message that must not be redelivered is not taken again after its lease');
  assert.equal((await message(topic, 'once')).state, 'unknown');
});

test('url mode: POSTs the payload with Idempotency-Key, the headers and Idem-Attempt; a 2xx is delivered', async () => {
  const topic = newTopic();
  const hook = await receiver(() => ({ status: 201, headers: { 'content-type': 'text/plain' }, body: 'thanks-1' }));
  const logger = memoryLogger();
  const d = createDispatcher({ pool, topic, url: hook.url, pollInterval: 100, logger });
  try {
    await d.start();
    const payload = Buffer.from('{"amount": 12}\n\u0000');
    await put(topic, 'k1', payload, { headers: { 'Content-Type': 'application/json', 'X-Trace': ['a', 'b'] } });
    const m = await settled(topic, 'k1');
    assert.equal(m.state, 'delivered');
    assert.equal(m.attempt, 1);
    assert.equal(m.status, 201);
    assert.equal(String(m.body), 'thanks-1');
    assert.equal(hook.requests.length, 1);
    const [r] = hook.requests;
    assert.deepEqual(r.body, payload);
    assert.equal(r.headers['idempotency-key'], `acme/${topic}/k1`);
    assert.equal(r.headers['idem-attempt'], '1');
    assert.equal(r.headers['content-type'], 'application/json');
    assert.equal(r.headers['x-trace'], 'a, b');
    assert.ok(logger.lines.some((l) => l.level === 'info' && l.text.includes(`acme/${topic}/k1 attempt 1`)
      && l.text.includes('delivered')), JSON.stringify(logger.lines));
  } finally {
    await d.stop();
    await hook.close();
  }
});

test('url mode: 503 and 429 are retried after their Retry-After (seconds, HTTP-date), then a 2xx is delivered', async () => {
  const topic = newTopic();
  let retryAt;
  const hook = await receiver(({ headers }) => {
    const attempt = Number(headers['idem-attempt']);
    if (attempt === 1) return { status: 503, headers: { 'Retry-After': '2' }, body: 'busy' };
    if (attempt === 2) {
      retryAt = new Date(Math.ceil(Date.now() / 1000) * 1000 + 2000);  // whole seconds, as an HTTP-date has
      return { status: 429, headers: { 'Retry-After': retryAt.toUTCString() } };
    }
    return { status: 200, body: `done-${attempt}` };
  });
  const logger = memoryLogger();
  const d = createDispatcher({ pool, topic, url: hook.url, pollInterval: 100, logger });
  // the message between two attempts: queued, due at the time Retry-After named
  const waiting = (attempt) => until(async () => {
    const m = await message(topic, 'k');
    return m.state === 'queued' && m.attempt === attempt && m;
  }, `attempt ${attempt} recorded`);
  try {
    await d.start();
    await put(topic, 'k', 'payload');
    const first = await waiting(1);
    const answered = hook.requests[0].at;
    assert.ok(Math.abs(first.not_before - (answered + 2000)) < 500,
      `due ${first.not_before - answered} ms after the answer, not 2000`);
    const second = await waiting(2);
    assert.ok(Math.abs(second.not_before - retryAt) < 500, `due ${second.not_before - retryAt} ms from the HTTP-date`);
    const m = await settled(topic, 'k');
    assert.equal(m.state, 'delivered');
    assert.equal(m.attempt, 3);
    assert.equal(String(m.body), 'done-3');
    const [a, b, c] = hook.requests;
    assert.equal(hook.requests.length, 3);
    assert.deepEqual([a, b, c].map((r) => r.headers['idempotency-key']), Array(3).fill(`acme/${topic}/k`));
    assert.deepEqual([a, b, c].map((r) => r.headers['idem-attempt']), ['1', '2', '3']);
    assert.ok(b.at - a.at >= 1900, `Retry-After: 2 kept the retry back ${b.at - a.at} ms`);
    assert.ok(c.at >= retryAt.getTime() - 100, `the HTTP-date kept the retry back until ${c.at - retryAt.getTime()} ms from it`);
    assert.ok(logger.lines.some((l) => l.level === 'warn' && l.text.includes('attempt 1') && l.text.includes('HTTP 503: busy')));
  } finally {
    await d.stop();
    await hook.close();
  }
});

test('url mode: a 404 is dead at once; a timeout and a refused connection are retried', async () => {
  const topic = newTopic();
  const hook = await receiver(async ({ headers }) => {
    const key = headers['idempotency-key'].split('/').pop();
    if (key === 'missing') return { status: 404, body: 'no such hook' };
    if (headers['idem-attempt'] === '1') await sleep(1500);
    return { status: 200, body: 'late' };
  });
  const logger = memoryLogger();
  const d = createDispatcher({ pool, topic, url: hook.url, pollInterval: 100, timeout: 300, lease: 5000, logger });
  // a port nothing listens on
  const closed = net.createServer();
  await new Promise((r) => closed.listen(0, '127.0.0.1', r));
  const deadUrl = `http://127.0.0.1:${closed.address().port}/`;
  await new Promise((r) => closed.close(r));
  const refusedTopic = newTopic();
  const refused = createDispatcher({ pool, topic: refusedTopic, url: deadUrl, pollInterval: 100, logger });
  try {
    await Promise.all([d.start(), refused.start()]);
    await put(topic, 'missing', 'x');
    await put(topic, 'slow', 'x');
    await put(refusedTopic, 'nobody', 'x');
    const missing = await settled(topic, 'missing');
    assert.equal(missing.state, 'dead');
    assert.match(missing.last_error, /HTTP 404: no such hook/);
    const slow = await settled(topic, 'slow');
    assert.equal(slow.state, 'delivered');
    assert.equal(slow.attempt, 2);
    assert.equal(String(slow.body), 'late');
    assert.ok(logger.lines.some((l) => l.level === 'warn' && l.text.includes(`acme/${topic}/slow attempt 1`)
      && l.text.includes('no answer within 300 ms')), JSON.stringify(logger.lines));
    assert.equal(hook.requests.filter((r) => r.headers['idempotency-key'].endsWith('/missing')).length, 1);
    const nobody = await until(async () => {
      const m = await message(refusedTopic, 'nobody');
      return m.last_error && m;
    }, 'the refused delivery recorded');
    // retried, not dead: queued for its backoff, or already taken again by
    // the dispatcher polling every 100 ms (the matrix's pg17 run saw leased)
    assert.ok(['queued', 'leased'].includes(nobody.state), nobody.state);
    assert.match(nobody.last_error, /ECONNREFUSED/);
  } finally {
    await Promise.all([d.stop(), refused.stop()]);
    await hook.close();
  }
});

test('handler mode: the message as the handler gets it; results and throws mapped as in url mode', async () => {
  const topic = newTopic();
  const seen = [];
  const handler = async (m, { signal }) => {
    seen.push(m);
    switch (m.key) {
      case 'ok': return { status: 201, body: { n: 1 } };
      case 'nothing': return undefined;
      case 'bad': return { status: 400, body: 'no' };
      case 'throws':
        if (m.attempt === 1) throw new Error('boom');
        return { status: 200 };
      case 'busy': return m.attempt === 1 ? { status: 503, retryAfter: 0 } : { status: 204 };
      case 'slow':
        if (m.attempt === 1) {
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
          throw signal.reason;
        }
        return { body: 'fast now' };
      default: throw new Error(`unexpected ${m.key}`);
    }
  };
  const logger = memoryLogger();
  const d = createDispatcher({ pool, topic, handler, pollInterval: 100, timeout: 300, lease: 5000, logger });
  try {
    await d.start();
    const enq = await put(topic, 'ok', Buffer.from([7]), { headers: { h: 'v' } });
    for (const key of ['nothing', 'bad', 'throws', 'busy', 'slow']) await put(topic, key, key);
    const ok = await settled(topic, 'ok');
    assert.deepEqual([ok.state, ok.status, JSON.parse(ok.body)], ['delivered', 201, { n: 1 }]);
    const nothing = await settled(topic, 'nothing');
    assert.deepEqual([nothing.state, nothing.status, nothing.body], ['delivered', null, null]);
    const bad = await settled(topic, 'bad');
    assert.equal(bad.state, 'dead');
    assert.match(bad.last_error, /HTTP 400: no/);
    const throws = await settled(topic, 'throws');
    assert.deepEqual([throws.state, throws.attempt, throws.status], ['delivered', 2, 200]);
    const busy = await settled(topic, 'busy');
    assert.deepEqual([busy.state, busy.attempt, busy.status], ['delivered', 2, 204]);
    const slow = await settled(topic, 'slow');
    assert.deepEqual([slow.state, slow.attempt, String(slow.body)], ['delivered', 2, 'fast now']);

    const m = seen.find((s) => s.key === 'ok');
    assert.deepEqual(Object.keys(m).sort(),
      ['attempt', 'headers', 'id', 'idempotencyKey', 'key', 'leaseExpiresAt', 'payload', 'tenant', 'topic']);
    assert.deepEqual({ ...m, leaseExpiresAt: undefined }, {
      id: enq.id, tenant: 'acme', topic, key: 'ok', payload: Buffer.from([7]), headers: { h: 'v' }, attempt: 1,
      leaseExpiresAt: undefined, idempotencyKey: `acme/${topic}/ok`,
    });
    assert.ok(m.leaseExpiresAt instanceof Date && m.leaseExpiresAt > Date.now() - 1000);
    const warned = (key, what) => logger.lines.some((l) => l.level === 'warn'
      && l.text.includes(`acme/${topic}/${key} attempt 1`) && l.text.includes(what));
    assert.ok(warned('throws', 'boom'), JSON.stringify(logger.lines));
    assert.ok(warned('slow', 'no answer within 300 ms'), JSON.stringify(logger.lines));
    assert.ok(logger.lines.some((l) => l.level === 'error' && l.text.includes(`acme/${topic}/bad attempt 1: dead`)));
  } finally {
    await d.stop();
  }
});

/**
 * Enqueue three messages, each after the one before arrived (`arrived`: key
 * to time), and resolve to their latencies from the commit.  A dispatcher
 * takes once on its own after starting or reconnecting; the later ones
 * come only by their notifications.
 */
async function latencies(topic, arrived, prefix) {
  const out = [];
  for (let i = 0; i < 3; i += 1) {
    const key = `${prefix}${i}`;
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await enqueue(client, { tenant: 'acme', topic, key, payload: 'x' });
      const committed = Date.now();
      await client.query('COMMIT');
      await until(() => arrived.has(key), `${key} delivered`, 10000);
      out.push(arrived.get(key) - committed);
    } finally {
      client.release();
    }
  }
  return out;
}

test('a notification wakes the dispatcher: a committed message goes out without waiting for the poll', async () => {
  const topic = newTopic();
  const arrived = new Map();
  const d = createDispatcher({
    pool, topic, pollInterval: 60000, logger: memoryLogger(),
    handler: (m) => { arrived.set(m.key, Date.now()); },
  });
  try {
    await d.start();
    // the poll is a minute away: each came by its notification
    const ms = await latencies(topic, arrived, 'k');
    assert.ok(Math.max(...ms) < 2000, `latencies ${ms.join(', ')} ms`);
  } finally {
    await d.stop();
  }
});

test('the LISTEN connection breaks: the dispatcher connects another and wakes on notifications again', async () => {
  const topic = newTopic();
  const app = `pg-idem-test-${randomUUID()}`;
  const own = new Pool({ max: 5, application_name: app });
  const arrived = new Map();
  const logger = memoryLogger();
  const d = createDispatcher({
    pool: own, topic, pollInterval: 60000, logger, handler: (m) => { arrived.set(m.key, Date.now()); },
  });
  const listeners = async () => (await pool.query(
    `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query = 'LISTEN idem_outbox'`, [app])).rows;
  try {
    await d.start();
    const [{ pid }] = await listeners();
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await until(async () => (await listeners()).some((r) => r.pid !== pid), 'a new LISTEN connection');
    const ms = await latencies(topic, arrived, 'after');
    assert.ok(Math.max(...ms) < 2000, `latencies ${ms.join(', ')} ms`);
    assert.ok(logger.lines.some((l) => l.level === 'warn' && l.text.includes('LISTEN connection broke')),
      JSON.stringify(logger.lines));
  } finally {
    await d.stop();
    await own.end();
  }
});

test('stop() waits for the deliveries in flight and releases the LISTEN client; start and stop twice are harmless', async () => {
  const topic = newTopic();
  const app = `pg-idem-test-${randomUUID()}`;
  const own = new Pool({ max: 10, application_name: app });
  const listening = async () => (await pool.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND query = 'LISTEN idem_outbox'`,
    [app])).rows[0].n;
  let open;
  const gate = new Promise((r) => { open = r; });
  const started = new Set();
  const d = createDispatcher({
    pool: own, topic, concurrency: 3, pollInterval: 100, logger: memoryLogger(),
    handler: async (m) => {
      started.add(m.key);
      await gate;
      return { status: 200, body: `done ${m.key}` };
    },
  });
  try {
    const first = d.start();
    assert.equal(d.start(), first);
    await first;
    assert.equal(await listening(), 1);
    for (const key of ['a', 'b', 'c']) await put(topic, key, key);
    await until(() => started.size === 3, 'three deliveries in flight');
    let stopped = false;
    const stopping = d.stop().then(() => { stopped = true; });
    assert.equal(d.stop(), d.stop());
    await sleep(300);
    assert.equal(stopped, false, 'stop() waits for the handlers');
    await put(topic, 'd', 'd');
    open();
    await stopping;
    for (const key of ['a', 'b', 'c']) {
      const m = await message(topic, key);
      assert.deepEqual([m.state, String(m.body)], ['delivered', `done ${key}`]);
    }
    assert.equal(own.totalCount, own.idleCount, 'every client is back in the pool');
    assert.equal(await listening(), 0, 'the LISTEN client unlistened');
    assert.equal((await message(topic, 'd')).state, 'queued', 'nothing is taken after stop()');
    await assert.rejects(d.start(), /stopped/);
  } finally {
    open();
    await d.stop();
    await own.end();
  }
});

test('a stale lease: the answer after another take is not recorded, and logged as a warning', async () => {
  const topic = newTopic();
  const logger = memoryLogger();
  let retaken;
  const d = createDispatcher({
    pool, topic, concurrency: 1, lease: 600, timeout: 300, pollInterval: 100, logger,
    // ignores its signal and outlives its lease, until another take has the message
    handler: async () => {
      retaken = await until(async () => (await pool.query('SELECT id, attempt FROM idem_take($1)', [topic])).rows[0],
        'the message taken again after the lease');
      return { status: 200, body: 'too late' };
    },
  });
  try {
    await d.start();
    await put(topic, 'k', 'x');
    await until(() => logger.lines.some((l) => l.text.includes('stale lease')), 'the stale lease logged');
  } finally {
    await d.stop();
  }
  const stale = logger.lines.find((l) => l.text.includes('stale lease'));
  assert.equal(stale.level, 'warn');
  assert.ok(stale.text.includes(`acme/${topic}/k attempt 1`), stale.text);
  assert.equal(retaken.attempt, 2);
  const m = await message(topic, 'k');
  assert.deepEqual([m.state, m.attempt, m.body], ['leased', 2, null], 'attempt 2 still holds it');
  await pool.query('SELECT idem_delivered($1, $2, 200)', [retaken.id, 2]);
  assert.equal((await message(topic, 'k')).state, 'delivered');
});

test('createDispatcher refuses bad options', () => {
  const base = { pool, topic: 't', handler: () => {} };
  assert.throws(() => createDispatcher({ ...base, url: 'http://x/' }), /either url or handler/);
  assert.throws(() => createDispatcher({ pool, topic: 't' }), /either url or handler/);
  assert.throws(() => createDispatcher({ ...base, pool: undefined }), /pool/);
  assert.throws(() => createDispatcher({ ...base, topic: '' }), /topic/);
  assert.throws(() => createDispatcher({ pool, topic: 't', url: 'not a url' }), /Invalid URL/);
  assert.throws(() => createDispatcher({ ...base, concurrency: 0 }), /concurrency/);
  assert.throws(() => createDispatcher({ ...base, batchSize: 1.5 }), /batchSize/);
  assert.throws(() => createDispatcher({ ...base, lease: 1000, timeout: 1000 }), RangeError);
  assert.throws(() => createDispatcher({ ...base, timeout: 30000 }), /shorter than the lease \(30000 ms\)/);
  assert.throws(() => createDispatcher({ ...base, purgeInterval: 0 }), /purgeInterval/);
  assert.equal(typeof createDispatcher(base).start, 'function');
});

test('purgeInterval: the dispatcher calls idem_purge(), which deletes expired records', async () => {
  const key = `purge-${randomUUID()}`;
  await pool.query("SELECT idem_claim('acme', 'POST /purge', $1)", [key]);
  await pool.query("SELECT idem_complete('acme', 'POST /purge', $1, 200, 'done'::text)", [key]);
  await pool.query("UPDATE idem_record SET expires_at = now() - interval '1 second' WHERE key = $1", [key]);
  const logger = memoryLogger();
  const d = createDispatcher({ pool, topic: newTopic(), handler: () => {}, purgeInterval: 50, logger });
  try {
    await d.start();
    await until(async () => (await pool.query('SELECT 1 FROM idem_record WHERE key = $1', [key])).rowCount === 0,
      'the expired record purged');
  } finally {
    await d.stop();
  }
  assert.ok(logger.lines.some((l) => /idem_purge\(\) deleted [1-9]/.test(l.text)), 'the purge is logged');
});
