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
// The outcome -> HTTP mapping (Idempotency-Key, 409/422, Retry-After,
// Idempotent-Replayed, the stored headers) is the plugin ./idempotency.js.
//
// The tenant comes from the caller's credentials (a bearer token), never
// from the body, and each tenant's queries run as a database role bound to
// that tenant (idem_bind(role, tenant)), so a bug here still cannot
// replay one tenant's response to another.
'use strict';

const Fastify = require('fastify');
const { Pool } = require('pg');
const idempotency = require('./idempotency');

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

async function withClient(tenant, fn) {
  const client = await pools[tenant].connect();
  try { return await fn(client); } finally { client.release(); }
}

// Every API call names its tenant (credentials) and its key (header).
async function identify(req, reply) {
  req.tenant = tenantOf(req);
  if (!req.tenant) return reply.code(401).send({ error: 'unknown credentials' });
}

const JSON_HEADERS = { 'Content-Type': 'application/json' };

// The API's routes: a plugin registered after ./idempotency.js, whose
// decorators it uses
async function routes(app) {
  const preHandler = [identify, app.idempotencyKey];

  // Orders: the claim, the order and the stored response commit together.
  app.post('/v1/orders', { preHandler }, async (req, reply) => withClient(req.tenant, async (db) => {
    await db.query('BEGIN');
    try {
      const { rows: [claim] } = await db.query(
        'SELECT outcome, status, body, headers FROM idem_claim($1, $2, $3, $4::jsonb)',
        [req.tenant, 'POST /v1/orders', req.idempotencyKey, JSON.stringify(req.body)]);
      if (claim.outcome !== 'claimed') {
        await db.query('ROLLBACK');
        return reply.sendClaim(claim);
      }
      await new Promise((r) => setTimeout(r, ORDER_WORK_MS)); // the slow part of the work
      const { rows: [order] } = await db.query(
        'INSERT INTO orders (tenant, idem_key, item, qty) VALUES ($1, $2, $3, $4) RETURNING id, item, qty',
        [req.tenant, req.idempotencyKey, String(req.body.item), Number(req.body.qty) || 1]);
      const response = {
        status: 201,
        body: Buffer.from(JSON.stringify({ id: order.id, item: order.item, qty: order.qty })),
        headers: { ...JSON_HEADERS, Location: `/v1/orders/${order.id}` },
      };
      await db.query('SELECT idem_complete($1, $2, $3, $4, $5::bytea, headers => $6::jsonb)',
        [req.tenant, 'POST /v1/orders', req.idempotencyKey, response.status, response.body,
          JSON.stringify(response.headers)]);
      await db.query('COMMIT');
      return reply.sendResponse(response);
    } catch (e) {
      await db.query('ROLLBACK').catch(() => {});
      throw e; // a system error: nothing is left, the retry executes
    }
  }));

  app.post('/v1/payments', { preHandler }, (req, reply) => pay(req, reply));
}

// Payments: the effect is outside the database.
async function pay(req, reply) {
  const { tenant, idempotencyKey: idemKey } = req;
  const claim = await withClient(tenant, async (db) => (await db.query(
    'SELECT outcome, status, body, headers, attempt FROM idem_claim($1, $2, $3, $4::jsonb, lease => $5::interval)',
    [tenant, 'POST /v1/payments', idemKey, JSON.stringify(req.body), PAYMENT_LEASE])).rows[0]);
  if (claim.outcome !== 'claimed') return reply.sendClaim(claim);

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
  const response = { status: res.ok ? 201 : 402, body: Buffer.from(await res.text()), headers: JSON_HEADERS };
  await withClient(tenant, (db) => db.query(
    res.ok ? 'SELECT idem_complete($1, $2, $3, $4, $5::bytea, attempt => $6, headers => $7::jsonb)'
      : 'SELECT idem_fail($1, $2, $3, $4, $5::bytea, attempt => $6, headers => $7::jsonb)',
    [tenant, 'POST /v1/payments', idemKey, response.status, response.body, claim.attempt,
      JSON.stringify(response.headers)]));
  return reply.sendResponse(response);
}

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
          await admin.query('SELECT idem_complete($1, $2, $3, 201, $4::bytea, attempt => $5, headers => $6::jsonb)',
            [tenant, 'POST /v1/payments', key, body, attempt, JSON.stringify(JSON_HEADERS)]);
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

app.register(idempotency, { retryAfter: 1 });
app.register(routes);
app.post('/admin/reconcile', async () => ({ settled: await reconcile() }));

const timer = setInterval(() => reconcile().catch((e) => console.error('reconcile:', e.message)),
  Number(process.env.RECONCILE_EVERY_MS || 500));
timer.unref();

app.listen({ port: Number(process.env.PORT || 0), host: '127.0.0.1' }).then((address) => {
  console.log(`service listening on ${address}`);
});
