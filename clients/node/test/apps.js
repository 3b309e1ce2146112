// The example apps of the HTTP tests: the same routes on fastify and on
// Express, each with pg-idem.  tenant: the X-Tenant header.
'use strict';

const Fastify = require('fastify');
const expressLib = require('express');
const idem = require('..');
const { routes } = require('./support');

const tenant = (request) => request.headers['x-tenant'] || 'acme';

async function fastifyApp(pool, gates, { storeAfterSend = false } = {}) {
  const app = Fastify({ logger: false });
  await app.register(idem.fastify, { pool, tenant });
  const r = routes('fastify', gates, pool);
  const send = (reply, { status, headers, body }) => reply.code(status).headers(headers).send(body);
  app.post('/items/:id', async (req, reply) => send(reply, await r.item(req)));
  app.post('/required/items/:id', { config: { idem: { required: true } } }, async (req, reply) => send(reply, await r.item(req)));
  app.post('/wait/items/:id', { config: { idem: { wait: 60000 } } }, async (req, reply) => send(reply, await r.item(req)));
  app.post('/boom', async (req, reply) => send(reply, await r.boom(req)));
  app.post('/declined', async (req, reply) => send(reply, await r.declined(req)));
  app.post('/slow-commit', async (req, reply) => send(reply, await r.slowCommit(req)));
  if (storeAfterSend) throw new Error('fastify has no store-after-send mode');
  const address = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: address, counts: r.counts, close: () => app.close() };
}

async function expressApp(pool, gates) {
  const app = expressLib();
  const r = routes('express', gates, pool);
  const json = expressLib.json();
  const plain = idem.express({ pool, tenant });
  const required = idem.express({ pool, tenant, required: true });
  const waiting = idem.express({ pool, tenant, wait: 60000 });
  const handle = (work) => (req, res, next) => {
    work(req).then(({ status, headers, body }) => res.status(status).set(headers).send(body), next);
  };
  app.post('/items/:id', json, plain, handle(r.item));
  app.post('/required/items/:id', json, required, handle(r.item));
  app.post('/wait/items/:id', json, waiting, handle(r.item));
  app.post('/boom', json, plain, handle(r.boom));
  app.post('/declined', json, plain, handle(r.declined));
  app.post('/slow-commit', json, plain, handle(r.slowCommit));
  // the application's own error handler: the status the error asks for
  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => {
    res.status(err.statusCode || 500).json({ error: err.message });
  });
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    counts: r.counts,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

module.exports = { fastifyApp, expressApp };
