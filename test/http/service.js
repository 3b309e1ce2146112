// test/http/service.js: an HTTP API on idem.  The example to copy.
//
//   POST /v1/orders    the effect is a row in this database: the plugin
//                      claims, the handler inserts the order in the claim's
//                      transaction (request.idem.client), and the plugin
//                      stores the response and commits before sending it.
//   POST /v1/payments  the effect is a charge at an external provider: the
//                      external-call pattern (the route's config.idem
//                      {external: true}): the claim commits first, the
//                      handler calls the provider with the same key, and the
//                      plugin stores its answer, fenced by the attempt.
//                      A decline (the provider's 4xx) is an answer: stored
//                      as 402 and replayed.  A provider's 5xx is not: the
//                      claim is failed as retryable and the client's retry
//                      calls the provider again, with the same key.  No
//                      answer at all leaves the claim pending: the charge
//                      may have happened, and reconciliation decides.
//   a reconciliation job settles payments whose claim outlived its lease
//   ("unknown") by asking the provider, then completes or releases them.
//
// The outcome -> HTTP mapping (Idempotency-Key, 400/409/422, Retry-After,
// Idempotent-Replayed, the stored headers) is the package pg-idem
// (clients/node), its fastify plugin.
//
// The tenant comes from the caller's credentials (a bearer token), never
// from the body, and each tenant's queries run as a database role bound to
// that tenant (idem_bind(role, tenant)), so a bug here still cannot
// replay one tenant's response to another.
'use strict';

const Fastify = require('fastify');
const { Pool } = require('pg');
const idem = require('pg-idem');

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

function tenantOf(req) {
  const m = /^Bearer (.+)$/.exec(req.headers.authorization || '');
  return m && tenants[m[1]];
}

const JSON_HEADERS = { 'Content-Type': 'application/json' };

// Every API call names its tenant (credentials) before the plugin claims
app.addHook('onRequest', async (req, reply) => {
  if (!req.url.startsWith('/v1/')) return undefined;
  req.tenant = tenantOf(req);
  if (!req.tenant) return reply.code(401).send({ error: 'unknown credentials' });
  return undefined;
});

app.register(idem.fastify, {
  pool: (req) => pools[req.tenant],
  tenant: (req) => req.tenant,
  required: true,
  retryAfter: 1,
});

// Orders: the claim, the order and the stored response commit together.
app.post('/v1/orders', async (req, reply) => {
  await new Promise((r) => setTimeout(r, ORDER_WORK_MS)); // the slow part of the work
  const { rows: [order] } = await req.idem.client.query(
    'INSERT INTO orders (tenant, idem_key, item, qty) VALUES ($1, $2, $3, $4) RETURNING id, item, qty',
    [req.tenant, req.idem.key, String(req.body.item), Number(req.body.qty) || 1]);
  reply.code(201).headers({ ...JSON_HEADERS, Location: `/v1/orders/${order.id}` });
  return Buffer.from(JSON.stringify({ id: order.id, item: order.item, qty: order.qty }));
});

// Payments: the effect is outside the database.  The claim is committed
// before this handler runs: retries get 409 until it answers.
app.post('/v1/payments', { config: { idem: { external: true, lease: PAYMENT_LEASE } } }, async (req, reply) => {
  let res;
  try {
    res = await fetch(`${PROVIDER}/charges`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'idempotency-key': `${req.tenant}:${req.idem.key}`,
        ...(req.headers['x-provider-delay-ms'] ? { 'x-provider-delay-ms': req.headers['x-provider-delay-ms'] } : {}),
      },
      body: JSON.stringify({ amount: req.body.amount, card: req.body.card }),
    });
  } catch (e) {
    // No answer: the charge may or may not have happened.  A 5xx leaves the
    // claim pending; once its lease runs out it is "unknown" and reconciled.
    reply.code(502).type('application/problem+json');
    return { type: 'about:blank', title: 'Bad Gateway', status: 502, detail: 'payment provider did not answer; retry later' };
  }
  if (res.status >= 500) {
    // The provider answered that it could not process the charge: nothing
    // to replay.  Failed as retryable (fenced by the attempt), so the next
    // retry runs again; the provider deduplicates by the key we send.  (The
    // plugin leaves a 5xx of an external call pending, for the case where
    // the call's effect is unknown.)
    await pools[req.tenant].query(
      `SELECT idem_fail($1, $2, $3, 503, $4::bytea, retryable => true, attempt => $5)`,
      [req.tenant, req.idem.endpoint, req.idem.key, Buffer.from(await res.text()), req.idem.attempt]);
    reply.code(503).header('Retry-After', '1').type('application/problem+json');
    return { type: 'about:blank', title: 'Service Unavailable', status: 503, detail: 'payment provider unavailable; retry later' };
  }
  // a charge (2xx) or a decline (4xx, a card declined): the provider's
  // answer, stored with the claim's attempt and replayed to every retry
  reply.code(res.ok ? 201 : 402).headers(JSON_HEADERS);
  return Buffer.from(await res.text());
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

app.post('/admin/reconcile', { config: { idem: false } }, async () => ({ settled: await reconcile() }));

const timer = setInterval(() => reconcile().catch((e) => console.error('reconcile:', e.message)),
  Number(process.env.RECONCILE_EVERY_MS || 500));
timer.unref();

app.listen({ port: Number(process.env.PORT || 0), host: '127.0.0.1' }).then((address) => {
  console.log(`service listening on ${address}`);
});
