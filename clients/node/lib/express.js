// pg-idem/lib/express.js: the Express middleware, and the wrapper of async
// handlers that Express 4 needs (it ignores the promise a handler returns).
//
//   const idempotent = idem.express({ pool, tenant: (req) => 'acme' });
//   app.post('/items/:id', express.json(), idempotent, idempotent.handler(async (req, res) => {
//     await req.idem.client.query('INSERT ...');   // the request's transaction
//     res.status(201).json({ ok: true });           // stored, committed, then sent
//   }));
//
// Mounted per route (after the body parser), the endpoint is the route's
// template (`POST /items/:id`); mounted with app.use, the path.
'use strict';

const { randomUUID } = require('node:crypto');
const core = require('./core');
const trace = require('./trace');

const kState = Symbol('pg-idem.state');

function sendAnswer(res, { status, headers, body }) {
  res.statusCode = status;
  for (const [name, value] of Object.entries(headers || {})) res.setHeader(name, value);
  res.end(body === null || body === undefined ? undefined : body);
}

// The response's headers with the names as the application set them
function responseHeaders(res) {
  const names = typeof res.getRawHeaderNames === 'function' ? res.getRawHeaderNames() : res.getHeaderNames();
  return core.storableHeaders(names.map((name) => [name, res.getHeader(name)]));
}

/**
 * Hold the response back until it is stored: write, writeHead and end
 * collect it; once end is called, `store(response)` runs, and only then is
 * the response sent, whole, by the real methods.  Until then,
 * `state.replace(answer)` drops what was written and answers that instead.
 */
function holdResponse(res, state, store) {
  const real = { write: res.write, end: res.end, writeHead: res.writeHead };
  const chunks = [];
  const push = (chunk, encoding) => {
    if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
    chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8'));
  };
  state.replace = (answer) => {
    chunks.length = 0;
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    sendAnswer(res, answer);
  };
  res.writeHead = function writeHead(status, reason, headers) {
    res.statusCode = status;
    const h = typeof reason === 'string' ? headers : reason;
    if (typeof reason === 'string') res.statusMessage = reason;
    if (Array.isArray(h)) {
      for (let i = 0; i + 1 < h.length; i += 2) res.setHeader(h[i], h[i + 1]);
    } else if (h) {
      for (const [name, value] of Object.entries(h)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function write(chunk, encoding, cb) {
    push(chunk, encoding);
    const done = typeof encoding === 'function' ? encoding : cb;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    if (state.answered) return res;
    state.answered = true;
    push(chunk, encoding);
    const done = [chunk, encoding, cb].find((a) => typeof a === 'function');
    const isHead = res.req && res.req.method === 'HEAD';
    const body = chunks.length || !isHead ? Buffer.concat(chunks) : null;
    Promise.resolve(store({ status: res.statusCode, headers: responseHeaders(res), body }))
      .then((replacement) => {
        Object.assign(res, real);
        if (replacement) {
          // the store failed: answer that instead, never an unstored response
          for (const name of res.getHeaderNames()) res.removeHeader(name);
          sendAnswer(res, replacement);
        } else {
          if (res.getHeader('content-length') !== undefined) res.setHeader('Content-Length', body.length);
          res.end(body, done);
        }
      });
    return res;
  };
}

/**
 * The Express middleware; its `handler(fn)` wraps a route's handler.
 * @param {import('..').HttpOptions} options
 * @returns {import('..').ExpressMiddleware}
 */
function idemExpress(options) {
  const opts = core.httpOptions(options);
  const headerLower = opts.header.toLowerCase();
  if (options.requestId !== undefined && typeof options.requestId !== 'function') {
    throw new TypeError('pg-idem: the requestId option must be a function of the request');
  }
  // the request's id where no traceparent names its trace: the option, an
  // id an earlier middleware gave (req.id), else a new UUID
  const requestId = options.requestId || ((req) => (typeof req.id === 'string' && req.id !== '' ? req.id : randomUUID()));
  const logger = options.logger || null;
  const report = (what, err, req) => {
    if (opts.onError) opts.onError(err, req);
    else console.error(core.failureLine(what, err, req.idem));
  };

  async function pgIdem(req, res, next) {
    let client = null;
    try {
      if (!opts.methods.has(req.method)) { next(); return; }
      const { key = null, problem } = core.checkKey(req.headers[headerLower], opts.header);
      if (problem) { sendAnswer(res, problem); return; }
      if (key === null && opts.required) {
        sendAnswer(res, core.problem(400, `this request needs an ${opts.header} header`, 'idempotency-key-missing'));
        return;
      }
      const template = req.route && typeof req.route.path === 'string'
        ? `${req.baseUrl || ''}${req.route.path}` : `${req.baseUrl || ''}${req.path}`;
      const scope = {
        schema: opts.schema,
        tenant: key === null ? null : await core.tenantOf(opts, req),
        endpoint: `${req.method} ${template}`,
        key,
        trace: trace.requestTrace(req.headers, await requestId(req)),
      };
      const fingerprint = key === null ? null
        : core.requestFingerprint(opts, req, req.method, req.originalUrl || req.url, req.body);
      const begun = await core.begin(opts.pool(req), scope, {
        fingerprint, wait: opts.wait, waitTimeout: opts.waitTimeout, lease: opts.lease,
      });
      client = begun.client;
      const { claim } = begun;
      if (claim) trace.logDecision(logger, trace.decisionFields(scope, claim, scope.trace));
      if (claim && claim.outcome !== 'claimed') {
        client.release();
        client = null;
        sendAnswer(res, core.outcomeAnswer(claim, opts));
        return;
      }
      const tx = {
        client, claim, scope, fingerprint, retryAfter: opts.retryAfter,
        report: (e, what) => report(what, e, req),
      };
      client = null;
      const state = { thrown: undefined, answered: false };
      req[kState] = state;
      req.idem = {
        client: tx.client, tenant: scope.tenant, endpoint: scope.endpoint, key,
        attempt: claim ? claim.attempt : null, expiresAt: claim ? claim.expires_at : null,
        outcome: claim ? 'claimed' : 'none', trace: scope.trace,
      };
      // the response is stored and committed before a byte of it is sent,
      // so that a retry sent the instant it arrives gets the replay
      holdResponse(res, state, (response) => core.settle(tx, response, state.thrown));
      next();
    } catch (e) {
      if (client) {
        await client.query('ROLLBACK').catch(() => {});
        client.release();
      }
      next(e);
    }
  }

  /**
   * A route handler that may be async: what it throws or rejects with is
   * answered (problem+json, the status the error asks for, else 500) and,
   * under a key, recorded as a thrown error is: a 4xx stored, a 5xx
   * retryable; the handler's writes are rolled back either way.
   */
  pgIdem.handler = function handler(fn) {
    if (typeof fn !== 'function') throw new TypeError('pg-idem: handler() takes the route\'s handler');
    return async function idemHandler(req, res, next) {
      try {
        await fn(req, res, next);
      } catch (err) {
        const state = req[kState];
        if (!state && res.headersSent) { next(err); return; }
        const answer = core.thrownProblem(err);
        if (answer.status >= 500) report('the handler failed', err, req);
        if (!state) { sendAnswer(res, answer); return; }
        // an answer already given is being stored: it stands
        if (state.answered) return;
        state.thrown = err;
        state.replace(answer);
      }
    };
  };

  return pgIdem;
}

module.exports = idemExpress;
