// test/http/service.js: an HTTP API on idem.  The example to copy.
//
//   POST /v1/orders    the effect is a row in this database: claim, insert
//                      the order and complete, all in one transaction.
//   POST /v1/payments  the effect is a charge at an external provider:
//                      claim and commit, call the provider with the same
//                      key, then complete (the cross-transaction pattern).
//   a reconciliation job settles payments whose claim outlived its lease
//   ("unknown") by asking the provider, then completes or releases them.
//
// The tenant comes from the caller's credentials (a bearer token), never
// from the body, and each tenant's queries run as a database role bound to
// that tenant (idem_bind(role, tenant)), so a bug here still cannot
// replay one tenant's response to another.
'use strict';

const Fastify = require('fastify');
const { Pool } = require('pg');

const PAYMENT_LEASE = process.env.PAYMENT_LEASE || '2 seconds';
const ORDER_WORK_MS = Number(process.env.ORDER_WORK_MS || 300);
const PROVIDER = process.env.PROVIDER_URL;

// credentials -> tenant, and one pool per tenant, as that tenant's role
const tenants = { 'token-acme': 'acme', 'token-globex': 'globex' };
const pools = Object.fromEntries(Object.values(tenants).map((t) => [t, new Pool({
  user: `idem_app_${t}`, max: 10, application_name: `orders-${t}`,
})]));
const admin = new Pool({ max: 2, application_name: 'reconciler' });

const app = Fastify({ logger: false });
// keep request bodies as bytes too: the fingerprint is the canonical JSON
app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
  try { done(null, body === '' ? {} : JSON.parse(body)); } catch (e) { e.statusCode = 400; done(e); }
});

function tenantOf(req) {
  const m = /^Bearer (.+)$/.exec(req.headers.authorization || '');
  return m && tenants[m[1]];
}

// Answer a claim that is not ours to execute.
function answerSettled(reply, claim) {
  switch (claim.outcome) {
    case 'replay':
      return reply.code(claim.status).header('Idempotent-Replayed', 'true')
        .header('content-type', 'application/json').send(claim.body);
    case 'mismatch':
      return reply.code(422).send({ error: 'this Idempotency-Key was used with a different request' });
    case 'in_progress':
    case 'unknown':
      return reply.code(409).header('Retry-After', '1')
        .send({ error: `a request with this Idempotency-Key is ${claim.outcome === 'unknown' ? 'being reconciled' : 'in progress'}` });
    default:
      throw new Error(`unexpected outcome ${claim.outcome}`);
  }
}

async function withClient(tenant, fn) {
  const client = await pools[tenant].connect();
  try { return await fn(client); } finally { client.release(); }
}

// Every API call names its tenant (credentials) and its key (header).
async function identify(req, reply) {
  req.tenant = tenantOf(req);
  if (!req.tenant) return reply.code(401).send({ error: 'unknown credentials' });
  req.idemKey = req.headers['idempotency-key'];
  if (!req.idemKey) return reply.code(400).send({ error: 'an Idempotency-Key header is required' });
}

// Orders: the claim, the order and the stored response commit together.
app.post('/v1/orders', { preHandler: identify }, async (req, reply) => withClient(req.tenant, async (db) => {
  await db.query('BEGIN');
  try {
    const { rows: [claim] } = await db.query(
      'SELECT outcome, status, body FROM idem_claim($1, $2, $3, $4::jsonb)',
      [req.tenant, 'POST /v1/orders', req.idemKey, JSON.stringify(req.body)]);
    if (claim.outcome !== 'claimed') {
      await db.query('ROLLBACK');
      return answerSettled(reply, claim);
    }
    await new Promise((r) => setTimeout(r, ORDER_WORK_MS)); // the slow part of the work
    const { rows: [order] } = await db.query(
      'INSERT INTO orders (tenant, idem_key, item, qty) VALUES ($1, $2, $3, $4) RETURNING id, item, qty',
      [req.tenant, req.idemKey, String(req.body.item), Number(req.body.qty) || 1]);
    const body = Buffer.from(JSON.stringify({ id: order.id, item: order.item, qty: order.qty }));
    await db.query('SELECT idem_complete($1, $2, $3, 201, $4::bytea)',
      [req.tenant, 'POST /v1/orders', req.idemKey, body]);
    await db.query('COMMIT');
    return reply.code(201).header('content-type', 'application/json').send(body);
  } catch (e) {
    await db.query('ROLLBACK').catch(() => {});
    throw e; // a system error: nothing is left, the retry executes
  }
}));

// Payments: the effect is outside the database.
app.post('/v1/payments', { preHandler: identify }, async (req, reply) => {
  const { tenant, idemKey } = req;
  const claim = await withClient(tenant, async (db) => (await db.query(
    'SELECT outcome, status, body, attempt FROM idem_claim($1, $2, $3, $4::jsonb, lease => $5::interval)',
    [tenant, 'POST /v1/payments', idemKey, JSON.stringify(req.body), PAYMENT_LEASE])).rows[0]);
  if (claim.outcome !== 'claimed') return answerSettled(reply, claim);

  // The claim is committed: retries now get 409 until we finish.
  let res;
  try {
    res = await fetch(`${PROVIDER}/charges`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'idempotency-key': `${tenant}:${idemKey}`,
        ...(req.headers['x-provider-delay-ms'] ? { 'x-provider-delay-ms': req.headers['x-provider-delay-ms'] } : {}),
      },
      body: JSON.stringify({ amount: req.body.amount }),
    });
  } catch (e) {
    // No answer: the charge may or may not have happened.  Leave the claim
    // pending; once its lease runs out it is "unknown" and reconciled.
    return reply.code(502).send({ error: 'payment provider did not answer; retry later' });
  }
  const body = Buffer.from(await res.text());
  await withClient(tenant, (db) => db.query(
    res.ok ? 'SELECT idem_complete($1, $2, $3, $4, $5::bytea, attempt => $6)'
      : 'SELECT idem_fail($1, $2, $3, $4, $5::bytea, attempt => $6)',
    [tenant, 'POST /v1/payments', idemKey, res.ok ? 201 : 402, body, claim.attempt]));
  return reply.code(res.ok ? 201 : 402).header('content-type', 'application/json').send(body);
});

// Reconciliation: settle every payment whose claim outlived its lease.
async function reconcile() {
  let settled = 0;
  for (const tenant of Object.values(tenants)) {
    const { rows } = await admin.query(
      `SELECT key, attempt FROM idem_list($1, 'POST /v1/payments', max_rows => 1000)
        WHERE state = 'pending' AND lease_expires_at < now()`, [tenant]);
    for (const { key, attempt } of rows) {
      const res = await fetch(`${PROVIDER}/charges/${encodeURIComponent(`${tenant}:${key}`)}`);
      try {
        if (res.status === 200) {
          const body = Buffer.from(await res.text());
          await admin.query('SELECT idem_complete($1, $2, $3, 201, $4::bytea, attempt => $5)',
            [tenant, 'POST /v1/payments', key, body, attempt]);
        } else {
          await admin.query('SELECT idem_release($1, $2, $3, attempt => $4)',
            [tenant, 'POST /v1/payments', key, attempt]);
        }
        settled += 1;
      } catch (e) {
        // 55000: a retry re-claimed or finished it meanwhile; the fencing
        // token kept us from touching that later attempt
        if (e.code !== '55000') throw e;
      }
    }
  }
  return settled;
}

app.post('/admin/reconcile', async () => ({ settled: await reconcile() }));

const timer = setInterval(() => reconcile().catch((e) => console.error('reconcile:', e.message)),
  Number(process.env.RECONCILE_EVERY_MS || 500));
timer.unref();

app.listen({ port: Number(process.env.PORT || 0), host: '127.0.0.1' }).then((address) => {
  console.log(`service listening on ${address}`);
});
