// pg-idem/lib/fastify.js: the fastify plugin.
//
//   app.register(idem.fastify, { pool, tenant: (request) => 'acme' });
//   app.post('/items/:id', async (request, reply) => {
//     await request.idem.client.query('INSERT ...');   // the request's transaction
//     return reply.code(201).send({ ok: true });         // stored, then sent
//   });
//
// A route's `config.idem` is `false` (no idempotency there) or an object
// overriding the plugin's options for that route (`required`, `wait`,
// `lease`, `external`).
'use strict';

const { Readable } = require('node:stream');
const core = require('./core');
const trace = require('./trace');

const kState = Symbol('pg-idem.state');

function routeConfig(request, reply) {
  const config = (request.routeOptions && request.routeOptions.config)
    || (reply.context && reply.context.config) || {};
  return config.idem;
}

function routeTemplate(request) {
  return (request.routeOptions && request.routeOptions.url) || request.routerPath
    || request.url.split('?')[0];
}

async function payloadBytes(payload) {
  if (payload === undefined || payload === null) return null;
  if (typeof payload === 'string' || Buffer.isBuffer(payload)) return Buffer.from(payload);
  if (payload instanceof Readable || typeof payload.pipe === 'function') {
    const chunks = [];
    for await (const chunk of payload) chunks.push(Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(String(payload));
}

function sendAnswer(reply, { status, headers, body }) {
  reply.code(status);
  for (const [name, value] of Object.entries(headers || {})) reply.header(name, value);
  return reply.send(body === null || body === undefined ? '' : body);
}

/**
 * The fastify plugin (not encapsulated: its hooks reach the routes
 * registered after it in the registering scope).
 * @param {import('fastify').FastifyInstance} app
 * @param {import('..').HttpOptions} options
 */
function idemFastify(app, options, done) {
  let base;
  try { base = core.httpOptions(options); } catch (e) { done(e); return; }
  const headerLower = base.header.toLowerCase();

  app.decorateRequest('idem', null);

  app.addHook('preHandler', async (request, reply) => {
    const route = routeConfig(request, reply);
    if (route === false || !base.methods.has(request.method)) return undefined;
    const opts = route && typeof route === 'object' ? { ...base, ...route } : base;
    if (route && route.wait !== undefined) {
      opts.waitTimeout = route.wait === true ? 10000 : Number(route.wait || 0);
      opts.wait = opts.waitTimeout > 0;
    }
    const { key = null, problem } = core.checkKey(request.headers[headerLower], base.header);
    if (problem) return sendAnswer(reply, problem);
    if (key === null && opts.required) {
      return sendAnswer(reply, core.problem(400, `this request needs an ${base.header} header`, 'idempotency-key-missing'));
    }
    const scope = {
      schema: opts.schema,
      tenant: key === null ? null : await core.tenantOf(opts, request),
      endpoint: `${request.method} ${routeTemplate(request)}`,
      key,
      // the traceparent's trace-id, else fastify's request id
      trace: trace.requestTrace(request.headers, request.id),
    };
    const external = Boolean(opts.external);
    const fingerprint = key === null ? null
      : core.requestFingerprint(opts, request, request.method, request.url, request.body);
    // external and without a key: nothing to claim, no transaction to hold
    const { client = null, claim = null } = external && key === null ? {}
      : await core.begin(opts.pool(request), scope, {
        fingerprint, wait: opts.wait, waitTimeout: opts.waitTimeout, lease: opts.lease,
      });
    if (claim) trace.logDecision(request.log, trace.decisionFields(scope, claim, scope.trace));
    if (claim && claim.outcome !== 'claimed') {
      client.release();
      return sendAnswer(reply, core.outcomeAnswer(claim, opts));
    }
    const state = {
      client, claim, scope, fingerprint, opts, external, error: null, sent: undefined, done: false,
    };
    if (external && client) {
      // the external-call pattern: the claim commits before the handler
      // calls out, so that retries see it (409) meanwhile
      try {
        await client.query('RELEASE SAVEPOINT idem_handler');
        await client.query('COMMIT');
      } finally {
        client.release();
        state.client = null;
      }
    }
    // what the reply sends last: an Error is one fastify serializes itself
    const { send } = reply;
    reply.send = function trackedSend(payload) {
      state.sent = payload;
      return send.call(this, payload);
    };
    request[kState] = state;
    request.idem = {
      client: state.client, tenant: scope.tenant, endpoint: scope.endpoint, key,
      attempt: claim ? claim.attempt : null, expiresAt: claim ? claim.expires_at : null,
      outcome: claim ? 'claimed' : 'none', trace: scope.trace,
    };
    return undefined;
  });

  app.addHook('onError', async (request, reply, error) => {
    if (request[kState]) request[kState].error = error;
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const state = request[kState];
    if (!state) return payload;
    if (state.done) {
      // A second send while the first is being stored: fastify sends again
      // when an async handler returned `reply` and the client went away
      // (the reply's promise settles on the premature close).  The first
      // send is the answer; this one never proceeds, so that fastify does
      // not write a second set of headers.
      if (state.storing || reply.raw.headersSent) return new Promise(() => {});
      return payload;
    }
    state.done = true;
    state.storing = true;
    const thrown = state.error === null ? undefined : state.error;
    let body;
    if (thrown !== undefined && state.sent === thrown) {
      // the error handler sent the error itself (fastify's default does):
      // answer problem+json, not fastify's JSON serialization of the error
      const p = core.thrownProblem(thrown, reply.statusCode);
      for (const [name, value] of Object.entries(p.headers)) reply.header(name, value);
      body = p.body;
    } else {
      body = await payloadBytes(payload);
    }
    const response = {
      status: reply.statusCode,
      headers: core.storableHeaders(Object.entries(reply.getHeaders())),
      body,
    };
    const report = (e, what) => {
      if (state.opts.onError) state.opts.onError(e, request);
      else request.log.error({ err: e }, core.failureLine(what, e, request.idem));
    };
    const tx = {
      client: state.client, claim: state.claim, scope: state.scope, fingerprint: state.fingerprint,
      retryAfter: state.opts.retryAfter, report,
    };
    state.client = null;
    let answer = null;
    if (!state.external) {
      answer = await core.settle(tx, response, thrown);
    } else if (state.claim && (thrown === undefined ? response.status < 500 : core.isStoredError(thrown))) {
      // an answer below 500 settles the claim (fenced by its attempt); a
      // 5xx or a throw leaves it pending: the call may have taken effect,
      // and reconciliation settles it once the lease runs out
      let client = null;
      try {
        client = await state.opts.pool(request).connect();
        await client.query('BEGIN');
        await client.query('SAVEPOINT idem_handler');
        await core.finishClaim(client, state.claim, state.scope, response, { store: true });
        await client.query('COMMIT');
      } catch (e) {
        if (client) await client.query('ROLLBACK').catch(() => {});
        report(e, 'storing the response failed');
        // the claim stays pending, to be reconciled: nothing to record
        answer = core.problem(500, 'the response could not be stored; the request stays to be reconciled',
          'idempotency-store-failed');
      } finally {
        if (client) client.release();
      }
    }
    state.storing = false;
    if (answer) {
      // never send an answer that a retry would not get back
      reply.code(answer.status);
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      for (const [name, value] of Object.entries(answer.headers)) reply.header(name, value);
      return answer.body;
    }
    return body === null ? payload : body;
  });

  // a request that never reached onSend (hijacked, or aborted by fastify)
  app.addHook('onResponse', async (request) => {
    const state = request[kState];
    if (state && state.client) {
      state.done = true;
      const { client } = state;
      state.client = null;
      await client.query('ROLLBACK').catch(() => {});
      client.release();
    }
  });

  done();
}

idemFastify[Symbol.for('skip-override')] = true;
idemFastify[Symbol.for('fastify.display-name')] = 'pg-idem';
idemFastify[Symbol.for('plugin-meta')] = { name: 'pg-idem', fastify: '>=4' };

module.exports = idemFastify;
