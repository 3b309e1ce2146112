// The example apps of the HTTP tests: the same routes on fastify and on
// Express, each with pg-idem.  tenant: the X-Tenant header.
'use strict';

const Fastify = require('fastify');
const expressLib = require('express');
const idem = require('..');
const { routes } = require('./support');

const tenant = (request) => request.headers['x-tenant'] || 'acme';

// every store failure reported to onError, kept in `errors` with the key
async function fastifyApp(pool, gates, { storeAfterSend = false } = {}) {
  const app = Fastify({ logger: false });
  const errors = [];
  await app.register(idem.fastify, { pool, tenant, onError: (err, request) => errors.push({ err, key: request.idem.key }) });
  const r = routes('fastify', gates);
  const send = (reply, { status, headers, body }) => reply.code(status).headers(headers).send(body);
  app.post('/items/:id', async (req, reply) => send(reply, await r.item(req)));
  app.post('/required/items/:id', { config: { idem: { required: true } } }, async (req, reply) => send(reply, await r.item(req)));
  app.post('/wait/items/:id', { config: { idem: { wait: 60000 } } }, async (req, reply) => send(reply, await r.item(req)));
  app.post('/boom', async (req, reply) => send(reply, await r.boom(req)));
  app.post('/declined', async (req, reply) => send(reply, await r.declined(req)));
  app.post('/slow-commit', async (req, reply) => send(reply, await r.slowCommit(req)));
  app.post('/big', async (req, reply) => send(reply, await r.big(req)));
  app.post('/flaky', async (req, reply) => send(reply, await r.flaky(req)));
  if (storeAfterSend) throw new Error('fastify has no store-after-send mode');
  const address = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: address, counts: r.counts, errors, close: () => app.close() };
}

// every handler as the README registers it: wrapped by the middleware's
// handler(), an async function that throws
async function expressApp(pool, gates) {
  const app = expressLib();
  const r = routes('express', gates);
  const errors = [];
  const onError = (err, req) => errors.push({ err, key: req.idem.key });
  const json = expressLib.json();
  const plain = idem.express({ pool, tenant, onError });
  const required = idem.express({ pool, tenant, required: true, onError });
  const waiting = idem.express({ pool, tenant, wait: 60000, onError });
  const handle = (mw, work) => mw.handler(async (req, res) => {
    const { status, headers, body } = await work(req);
    res.status(status).set(headers).send(body);
  });
  app.post('/items/:id', json, plain, handle(plain, r.item));
  app.post('/required/items/:id', json, required, handle(required, r.item));
  app.post('/wait/items/:id', json, waiting, handle(waiting, r.item));
  app.post('/boom', json, plain, handle(plain, r.boom));
  app.post('/declined', json, plain, handle(plain, r.declined));
  app.post('/slow-commit', json, plain, handle(plain, r.slowCommit));
  app.post('/big', json, plain, handle(plain, r.big));
  app.post('/flaky', json, plain, handle(plain, r.flaky));
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    counts: r.counts,
    errors,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

module.exports = { fastifyApp, expressApp };
