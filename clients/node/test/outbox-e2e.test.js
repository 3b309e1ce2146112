// The outbox end to end: business transactions enqueue (and some roll
// back), two dispatcher processes (dispatcher-child.js) deliver to a
// receiver that deduplicates by Idempotency-Key, answers 503 at random and
// sometimes hangs past the dispatchers' timeout, and the test SIGKILLs a
// dispatcher in the middle of its deliveries, several times.  At the end
// every committed message is delivered, no rolled-back one reached the
// receiver, every effect happened once, and what idem stored for each
// message (attempt and body) is an answer the receiver gave to a request of
// that attempt.  The same checker, on dispatchers that drop the fencing
// token, must find that last property broken.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');
const { enqueue } = require('..');
const { setupDatabase, newPool, randomUUID, receiver, until, sleep } = require('./support');

const pool = newPool();
before(async () => {
  await setupDatabase(pool);
  await pool.query('CREATE TABLE IF NOT EXISTS e2e_orders (topic text, order_key text, PRIMARY KEY (topic, order_key))');
});
after(() => pool.end());

const TENANT = 'e2e';
const CHILD = path.join(__dirname, 'dispatcher-child.js');

/**
 * A receiver that applies each order's effect once per Idempotency-Key and
 * answers every request of a key with that effect again, in a body unique
 * to the answer.  `fate({attempt})` picks an answer: `{status: 503}` (no
 * effect), or `{hang: ms}` before a 200.  `log` has every answer given:
 * key, Idem-Attempt, status and body.
 */
async function effectReceiver(fate) {
  const effects = new Map();  // order key -> times its effect was applied
  const stored = new Map();   // Idempotency-Key -> the effect's number
  const log = [];
  let answers = 0;
  const hook = await receiver(async ({ headers, body }) => {
    const key = headers['idempotency-key'];
    const attempt = Number(headers['idem-attempt']);
    const f = fate({ attempt });
    answers += 1;
    if (f.status === 503) {
      const answer = { key, attempt, status: 503, body: `busy #${answers}` };
      log.push(answer);
      return { status: 503, headers: f.retryAfter === undefined ? {} : { 'Retry-After': f.retryAfter }, body: answer.body };
    }
    if (!stored.has(key)) {
      const { order } = JSON.parse(body);
      effects.set(order, (effects.get(order) || 0) + 1);
      stored.set(key, stored.size + 1);
    }
    const answer = { key, attempt, status: 200, body: JSON.stringify({ effect: stored.get(key), answer: answers }) };
    if (f.hang) await sleep(f.hang);
    log.push(answer);
    return { status: 200, headers: { 'content-type': 'application/json' }, body: answer.body };
  });
  return { ...hook, effects, log };
}

/** A dispatcher process; `inFlight` counts its messages taken and not yet being recorded. */
function startChild(env) {
  const child = spawn(process.execPath, [CHILD], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
  const state = { child, inFlight: 0, logs: [], ready: false };
  state.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    const e = JSON.parse(line);
    if (e.event === 'ready') state.ready = true;
    else if (e.event === 'take') state.inFlight += e.n;
    else if (e.event === 'finish') state.inFlight -= 1;
    else if (e.event === 'log') state.logs.push(e);
  });
  return state;
}

/**
 * Run a scenario: `orders` business transactions (a quarter roll back) by
 * three producers, two dispatcher processes with `env`, `kills` SIGKILLs
 * of a dispatcher with deliveries in flight (each restarted at once), until
 * every committed message is delivered or `deadline` ms passed.
 */
async function scenario({ orders, pause, env, fate, kills = 0, deadline }) {
  const started = Date.now();
  const topic = `e2e-${randomUUID()}`;
  const hook = await effectReceiver(fate);
  const childEnv = {
    E2E_TOPIC: topic, E2E_URL: hook.url, PGOPTIONS: '-c idem.outbox_backoff=100ms -c idem.outbox_backoff_max=1s', ...env,
  };
  const children = [startChild(childEnv), startChild(childEnv)];
  const retired = [];
  const killed = [];
  try {
    await until(() => children.every((c) => c.ready), 'both dispatchers listening');
    const keys = Array.from({ length: orders }, (_, i) => `order-${i}`);
    const produce = async (mine) => {
      for (const key of mine) {
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          await client.query('INSERT INTO e2e_orders (topic, order_key) VALUES ($1, $2)', [topic, key]);
          await enqueue(client, { tenant: TENANT, topic, key, payload: { order: key, amount: key.length }, maxAttempts: 100 });
          await sleep(Math.random() * 20);
          await client.query(Math.random() < 0.25 ? 'ROLLBACK' : 'COMMIT');
        } finally {
          client.release();
        }
        await sleep(pause);
      }
    };
    const killer = async () => {
      while (killed.length < kills) {
        await sleep(700 + Math.random() * 600);
        // the one with the most deliveries in flight, once it has some
        const victim = await until(() => {
          const busiest = [...children].sort((a, b) => b.inFlight - a.inFlight)[0];
          return busiest.inFlight > 0 && busiest;
        }, 'a dispatcher with deliveries in flight', 10000);
        killed.push(victim.inFlight);
        victim.child.kill('SIGKILL');
        await victim.exited;
        retired.push(victim);
        children[children.indexOf(victim)] = startChild(childEnv);
      }
    };
    await Promise.all([produce(keys.filter((_, i) => i % 3 === 0)), produce(keys.filter((_, i) => i % 3 === 1)),
      produce(keys.filter((_, i) => i % 3 === 2)), killer()]);
    const committed = new Set((await pool.query('SELECT order_key FROM e2e_orders WHERE topic = $1', [topic]))
      .rows.map((r) => r.order_key));
    const messages = new Map();
    const read = async () => {
      const { rows } = await pool.query(
        `SELECT k AS order_key, m.* FROM unnest($1::text[]) k, idem_message($2, $3, k) m`, [keys, TENANT, topic]);
      messages.clear();
      for (const row of rows) messages.set(row.order_key, row);
      return [...committed].every((k) => messages.has(k) && ['delivered', 'dead'].includes(messages.get(k).state));
    };
    await until(read, 'every committed message finished', Math.max(1000, deadline - (Date.now() - started)))
      .catch(() => {});  // the checker says what is missing
    await read();
    // a graceful stop: each dispatcher records what is in flight, then exits 0
    for (const c of children) c.child.kill('SIGTERM');
    const exits = await Promise.all(children.map((c) => c.exited));
    return {
      topic, committed, rolledBack: keys.filter((k) => !committed.has(k)), messages, log: hook.log,
      effects: hook.effects, killed, exits, ms: Date.now() - started,
      logs: [...retired, ...children].flatMap((c) => c.logs),
    };
  } finally {
    for (const c of children) c.child.kill('SIGKILL');
    await hook.close();
  }
}

/** Every way the run broke the outbox's promises: a list of problems, empty if none. */
function check({ topic, committed, rolledBack, messages, log, effects }) {
  const problems = [];
  const idemKey = (key) => `${TENANT}/${topic}/${key}`;
  for (const key of committed) {
    const m = messages.get(key);
    if (!m || m.state !== 'delivered') {
      problems.push(`${key}: committed but ${m ? m.state : 'no message'}`);
      continue;
    }
    const body = m.body === null ? null : m.body.toString();
    const given = log.some((a) => a.key === idemKey(key) && a.attempt === m.attempt && a.status === m.status
      && a.status >= 200 && a.status <= 299 && a.body === body);
    if (!given) {
      problems.push(`${key}: stored attempt ${m.attempt} with ${m.status} ${body}, an answer no request of attempt ${m.attempt} got`);
    }
    if (effects.get(key) !== 1) problems.push(`${key}: effect applied ${effects.get(key) || 0} times`);
  }
  for (const key of rolledBack) {
    if (messages.has(key)) problems.push(`${key}: rolled back, yet idem has a message (${messages.get(key).state})`);
    if (log.some((a) => a.key === idemKey(key))) problems.push(`${key}: rolled back, yet the receiver was called`);
    if (effects.has(key)) problems.push(`${key}: rolled back, yet its effect was applied`);
  }
  return problems;
}

test('outbox end to end: rollbacks, 503s, hangs past the timeout and SIGKILLed dispatchers; each effect once', { timeout: 90000 }, async () => {
  const run = await scenario({
    orders: 120,
    pause: 120,
    kills: 4,
    deadline: 50000,
    env: { E2E_LEASE: '2000', E2E_TIMEOUT: '1000', E2E_POLL: '200', E2E_CONCURRENCY: '4' },
    fate: () => {
      const r = Math.random();
      if (r < 0.1) return { status: 503, retryAfter: '0' };
      if (r < 0.2) return { status: 503 };
      if (r < 0.3) return { hang: 1500 };  // past the timeout: aborted, retried
      return { hang: Math.random() * 150 };
    },
  });
  const problems = check(run);
  const stale = run.logs.filter((l) => l.text.includes('stale lease')).length;
  const timeouts = run.logs.filter((l) => l.text.includes('no answer within')).length;
  const busy = run.log.filter((a) => a.status === 503).length;
  console.log(`e2e: ${run.committed.size} committed, ${run.rolledBack.length} rolled back, ${run.log.length} requests `
    + `(${busy} answered 503), ${timeouts} timeouts, kills with ${run.killed.join(', ')} in flight, ${stale} stale, ${run.ms} ms`);
  assert.deepEqual(problems, []);
  assert.ok(run.committed.size > 60 && run.rolledBack.length > 10, 'both commits and rollbacks happened');
  assert.equal(run.killed.length, 4);
  assert.ok(busy > 0 && timeouts > 0, 'the receiver answered 503 and hung past the timeout');
  assert.deepEqual(run.exits, [{ code: 0, signal: null }, { code: 0, signal: null }], 'both stopped gracefully');
  assert.ok(run.log.length > run.committed.size, 'messages were delivered more than once (and deduplicated)');
});

// attempt 1 hangs past the (real) lease of 400 ms and answers before the
// timeout; the take of attempt 2 comes meanwhile and hangs longer, so that
// attempt 1's answer arrives while attempt 2 holds the lease
const staleScenario = (env) => scenario({
  orders: 10,
  pause: 250,
  deadline: 20000,
  env: {
    E2E_LEASE: '2000', E2E_TIMEOUT: '1000', E2E_POLL: '100', E2E_CONCURRENCY: '8', E2E_REAL_LEASE: '400', ...env,
  },
  fate: ({ attempt }) => {
    if (attempt === 1) return { hang: 700 };
    if (attempt === 2) return { hang: 600 };
    return {};
  },
});

test('the checker catches dispatchers that drop the fencing token', { timeout: 60000 }, async () => {
  const run = await staleScenario({ E2E_DROP_FENCING: '1' });
  const problems = check(run);
  console.log(`e2e, fencing token dropped: ${run.committed.size} committed, ${run.ms} ms; the checker found:\n${
    problems.map((p) => `  ${p}`).join('\n')}`);
  assert.ok(problems.some((p) => p.includes('an answer no request of attempt')), problems.join('\n'));
});

test('the same leases running out, with the fencing token kept: stale answers are refused, and the checker is content', { timeout: 60000 }, async () => {
  const run = await staleScenario({});
  const stale = run.logs.filter((l) => l.level === 'warn' && l.text.includes('stale lease'));
  console.log(`e2e, leases running out: ${run.committed.size} committed, ${stale.length} stale answers refused, ${run.ms} ms`);
  assert.deepEqual(check(run), []);
  assert.ok(stale.length > 0, 'answers came after their leases');
});
