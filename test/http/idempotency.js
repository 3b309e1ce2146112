// test/http/idempotency.js: a fastify plugin that maps idem's outcomes to
// HTTP.  The one file to copy: it has no dependency but fastify itself.
//
//   app.register(require('./idempotency'), { retryAfter: 1 });
//   app.post('/v1/orders', { preHandler: app.idempotencyKey }, async (req, reply) => {
//     const claim = ...idem_claim(tenant, endpoint, req.idempotencyKey, ...)...;
//     if (claim.outcome !== 'claimed') return reply.sendClaim(claim);
//     ...execute, idem_complete(..., status, body, headers => response.headers)...
//     return reply.sendResponse(response);   // { status, body, headers }
//   });
//
// What it does:
//   app.idempotencyKey   a preHandler: the Idempotency-Key request header
//                        becomes req.idempotencyKey; missing (or longer than
//                        idem's 255 bytes) is a 400
//   reply.sendClaim(c)   answers a claim that is not the caller's to
//                        execute (a row of idem_claim or idem_replay):
//                          replay       the stored status, headers and body,
//                                       with Idempotent-Replayed: true
//                          mismatch     422
//                          in_progress  409 with Retry-After
//                          unknown      409 with Retry-After (the first
//                                       attempt is being reconciled)
//   reply.sendResponse(r)  sends { status, body, headers } as stored, so
//                        that the first answer and every replay are the same
//
// Headers to store are a plain object of header names to strings (or arrays
// of strings, for a header sent more than once), as idem accepts them.  The
// hop-by-hop and framing headers (Connection, Content-Length, ...) are never
// replayed from storage: the server computes them for each answer.
'use strict';

const NOT_REPLAYED = new Set(['connection', 'content-length', 'keep-alive', 'transfer-encoding', 'date']);

function idempotency(fastify, opts, done) {
  const headerName = (opts.header || 'Idempotency-Key').toLowerCase();
  const retryAfter = String(opts.retryAfter ?? 1);

  fastify.decorateRequest('idempotencyKey', null);

  fastify.decorate('idempotencyKey', async function idempotencyKey(req, reply) {
    const key = req.headers[headerName];
    if (typeof key !== 'string' || key === '' || Buffer.byteLength(key) > 255) {
      return reply.code(400).send({ error: `an ${opts.header || 'Idempotency-Key'} header of 1 to 255 bytes is required` });
    }
    req.idempotencyKey = key;
  });

  // A stored response: status, body (bytes, or null for none) and headers
  fastify.decorateReply('sendResponse', function sendResponse({ status, body, headers }) {
    for (const [name, value] of Object.entries(headers || {})) {
      if (!NOT_REPLAYED.has(name.toLowerCase())) this.header(name, value);
    }
    return this.code(status).send(body == null ? '' : body);
  });

  fastify.decorateReply('sendClaim', function sendClaim(claim) {
    switch (claim.outcome) {
      case 'replay':
        this.header('Idempotent-Replayed', 'true');
        return this.sendResponse(claim);
      case 'mismatch':
        return this.code(422).send({ error: 'this Idempotency-Key was used with a different request' });
      case 'in_progress':
        return this.code(409).header('Retry-After', retryAfter)
          .send({ error: 'a request with this Idempotency-Key is in progress' });
      case 'unknown':
        return this.code(409).header('Retry-After', retryAfter)
          .send({ error: 'a request with this Idempotency-Key is being reconciled' });
      default:
        throw new Error(`sendClaim: outcome ${claim.outcome} is the caller's to execute`);
    }
  });

  done();
}

// Not encapsulated: the decorators reach the routes of the registering
// scope (what the fastify-plugin package does, without the dependency)
idempotency[Symbol.for('skip-override')] = true;
idempotency[Symbol.for('fastify.display-name')] = 'idempotency';

module.exports = idempotency;
