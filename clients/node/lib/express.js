// pg-idem/lib/express.js: the Express middleware.
//
//   app.post('/items/:id', express.json(), idem.express({ pool, tenant: (req) => 'acme' }),
//     async (req, res) => {
//       await req.idem.client.query('INSERT ...');   // the claim's transaction
//       res.status(201).json({ ok: true });           // stored, committed, then sent
//     });
//
// Mounted per route (after the body parser), the endpoint is the route's
// template (`POST /items/:id`); mounted with app.use, the path.
'use strict';

const core = require('./core');

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
 * the response sent, whole, by the real methods.
 */
function holdResponse(res, store) {
  const real = { write: res.write, end: res.end, writeHead: res.writeHead };
  const chunks = [];
  const push = (chunk, encoding) => {
    if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
    chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8'));
  };
  let ended = false;
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
    if (ended) return res;
    ended = true;
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
 * The Express middleware.
 * @param {import('..').HttpOptions} options
 * @returns {(req: any, res: any, next: (err?: unknown) => void) => Promise<void>}
 */
function idemExpress(options) {
  const opts = core.httpOptions(options);
  const headerLower = opts.header.toLowerCase();

  return async function pgIdem(req, res, next) {
    let client = null;
    try {
      if (!opts.methods.has(req.method)) { next(); return; }
      const { key, problem } = core.checkKey(req.headers[headerLower], opts.header);
      if (problem) { sendAnswer(res, problem); return; }
      if (!key) {
        if (opts.required) {
          sendAnswer(res, core.problem(400, `this request needs an ${opts.header} header`, 'idempotency-key-missing'));
        } else {
          next();
        }
        return;
      }
      const template = req.route && typeof req.route.path === 'string'
        ? `${req.baseUrl || ''}${req.route.path}` : `${req.baseUrl || ''}${req.path}`;
      const scope = { tenant: await core.tenantOf(opts, req), endpoint: `${req.method} ${template}`, key };
      const fingerprint = core.requestFingerprint(opts, req, req.method, req.originalUrl || req.url, req.body);
      const begun = await core.begin(opts.pool(req), scope, {
        fingerprint, wait: opts.wait, waitTimeout: opts.waitTimeout, lease: opts.lease,
      });
      client = begun.client;
      const { claim } = begun;
      if (claim.outcome !== 'claimed') {
        client.release();
        client = null;
        sendAnswer(res, core.outcomeAnswer(claim, opts));
        return;
      }
      const held = client;
      client = null;
      req.idem = {
        client: held, tenant: scope.tenant, endpoint: scope.endpoint, key,
        attempt: claim.attempt, expiresAt: claim.expires_at, outcome: 'claimed',
      };
      // the response is stored and committed before a byte of it is sent,
      // so that a retry sent the instant it arrives gets the replay
      holdResponse(res, async (response) => {
        try {
          await core.finishClaim(held, claim, scope, response);
          await held.query('COMMIT');
          return null;
        } catch (e) {
          await held.query('ROLLBACK').catch(() => {});
          if (typeof opts.onError === 'function') opts.onError(e, req);
          return core.problem(500, 'the response could not be stored; retry the request', 'idempotency-store-failed');
        } finally {
          held.release();
        }
      });
      next();
    } catch (e) {
      if (client) {
        await client.query('ROLLBACK').catch(() => {});
        client.release();
      }
      next(e);
    }
  };
}

module.exports = idemExpress;
