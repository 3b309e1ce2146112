// idempotentRequest: the caller's side, against local HTTP servers; and the
// retry policy it shares with the outbox dispatcher.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { idempotentRequest } = require('..');
const retry = require('../lib/retry');
const { receiver } = require('./support');

const fast = { baseDelayMs: 5, maxDelayMs: 50 };

test('a key is required: a TypeError before any call', async () => {
  let calls = 0;
  const hook = await receiver(() => { calls += 1; return { status: 200 }; });
  try {
    await assert.rejects(idempotentRequest(hook.url, { body: 'x' }), TypeError);
    await assert.rejects(idempotentRequest(hook.url, { body: 'x', key: '' }), TypeError);
    await assert.rejects(idempotentRequest(hook.url, { body: 'x', key: 'k'.repeat(256) }), TypeError);
    assert.equal(calls, 0);
  } finally {
    await hook.close();
  }
});

test('503 twice, then 201: three attempts with one key, succeeded', async () => {
  let n = 0;
  const hook = await receiver(() => {
    n += 1;
    return n <= 2 ? { status: 503, body: `busy ${n}` } : { status: 201, headers: { 'content-type': 'application/json' }, body: '{"id":7}' };
  });
  try {
    const r = await idempotentRequest(hook.url, { body: { amount: 42 }, key: 'order-7', ...fast });
    assert.equal(r.outcome, 'succeeded');
    assert.equal(r.status, 201);
    assert.deepEqual(JSON.parse(r.body), { id: 7 });
    assert.equal(r.key, 'order-7');
    assert.equal(r.attempts, 3);
    assert.deepEqual(hook.requests.map((q) => q.headers['idempotency-key']), ['order-7', 'order-7', 'order-7']);
    assert.ok(hook.requests.every((q) => q.headers['content-type'] === 'application/json'));
    assert.ok(hook.requests.every((q) => String(q.body) === '{"amount":42}'));
  } finally {
    await hook.close();
  }
});

test('422: one attempt, failed (no other 4xx is retried)', async () => {
  const hook = await receiver(() => ({ status: 422, body: 'bad amount' }));
  try {
    const r = await idempotentRequest(hook.url, { body: 'x', key: 'k-422', attempts: 5, ...fast });
    assert.deepEqual([r.outcome, r.status, String(r.body), r.attempts], ['failed', 422, 'bad amount', 1]);
    assert.equal(hook.requests.length, 1);
  } finally {
    await hook.close();
  }
});

test('no answer within the timeout: unknown with the key after the configured attempts, no exception', async () => {
  const sockets = new Set();
  let arrivals = 0;
  const server = http.createServer(() => { arrivals += 1; /* never answers */ });
  server.on('connection', (s) => sockets.add(s));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    const url = `http://127.0.0.1:${server.address().port}/slow`;
    const r = await idempotentRequest(url, { body: 'x', key: 'k-slow', attempts: 3, timeoutMs: 100, ...fast });
    assert.equal(r.outcome, 'unknown');
    assert.equal(r.key, 'k-slow');
    assert.equal(r.attempts, 3);
    assert.equal(r.status, null);
    assert.match(r.error, /no answer within 100 ms/);
    assert.equal(arrivals, 3);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
  }
});

test('a refused connection is retried and ends unknown', async () => {
  const server = http.createServer();
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  const r = await idempotentRequest(`http://127.0.0.1:${port}/`, { key: 'k-refused', attempts: 2, ...fast });
  assert.deepEqual([r.outcome, r.attempts, r.status], ['unknown', 2, null]);
});

test('Retry-After is honoured (seconds and HTTP-date); three identical answers stop early; 429 to the end is failed', async () => {
  let n = 0;
  const hook = await receiver(() => {
    n += 1;
    if (n === 1) return { status: 429, headers: { 'retry-after': '1' }, body: 'slow down' };
    return { status: 200, body: 'ok' };
  });
  try {
    const started = Date.now();
    const r = await idempotentRequest(hook.url, { key: 'k-ra', maxDelayMs: 5000, baseDelayMs: 5 });
    assert.equal(r.outcome, 'succeeded');
    assert.ok(hook.requests[1].at - hook.requests[0].at >= 950, 'waited for Retry-After: 1');
    assert.ok(Date.now() - started < 4000);
  } finally {
    await hook.close();
  }
  const same = await receiver(() => ({ status: 503, body: 'maintenance' }));
  try {
    const r = await idempotentRequest(same.url, { key: 'k-same', attempts: 10, ...fast });
    assert.deepEqual([r.outcome, r.status, r.attempts], ['unknown', 503, 3]);
  } finally {
    await same.close();
  }
  let m = 0;
  const limited = await receiver(() => {
    m += 1;
    return { status: 429, headers: { 'retry-after': new Date(Date.now() - 1000).toUTCString() }, body: `limited ${m}` };
  });
  try {
    const r = await idempotentRequest(limited.url, { key: 'k-429', attempts: 4, ...fast });
    assert.deepEqual([r.outcome, r.status, r.attempts], ['failed', 429, 4]);
  } finally {
    await limited.close();
  }
});

test('the policy: 408, 429 and 5xx retried; 2xx success; any other final; Retry-After and backoff', () => {
  assert.deepEqual([200, 201, 299, 301, 400, 404, 408, 409, 422, 429, 500, 503, 599].map(retry.classify),
    ['success', 'success', 'success', 'final', 'final', 'final', 'retry', 'final', 'final', 'retry', 'retry', 'retry', 'retry']);
  assert.equal(retry.retryAfterMs('3'), 3000);
  assert.equal(retry.retryAfterMs('soon'), null);
  const at = retry.retryAfterMs(new Date(Date.now() + 10000).toUTCString());
  assert.ok(at > 8000 && at <= 10000, String(at));
  for (let a = 1; a <= 10; a += 1) {
    const d = retry.backoffMs(a, { baseMs: 100, maxMs: 1000 });
    const ceiling = Math.min(1000, 100 * 2 ** (a - 1));
    assert.ok(d >= ceiling / 2 && d <= ceiling, `${a}: ${d}`);
  }
  assert.equal(retry.mayHaveActed(null), true);
  assert.equal(retry.mayHaveActed(503), true);
  assert.equal(retry.mayHaveActed(429), false);
});
