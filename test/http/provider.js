// test/http/provider.js: a fake payment provider, the external side effect.
//
// POST /charges (Idempotency-Key header, JSON {amount}) charges after a
// delay and answers the charge.  Like a real network, it is slow and
// sometimes performs the charge but drops the reply (DROP_EVERY: every Nth
// charge).  It does NOT deduplicate by key: every call charges again, so
// that the tests count exactly what idem prevented.  GET /charges/:key says
// whether a key was charged (what a reconciliation job asks); GET /stats
// counts charges per key, GET /calls every POST per key.  A card can make
// it fail: card "declined" is refused with 402 (a business answer: nothing
// is charged, ever), card "flaky" gets 503 at the first call of its key (a
// server error: nothing is charged, the next call charges).
'use strict';

const http = require('node:http');

const port = Number(process.env.PROVIDER_PORT || 0);
const delayMs = Number(process.env.PROVIDER_DELAY_MS || 150);
const dropEvery = Number(process.env.DROP_EVERY || 3);

const charges = new Map(); // key -> [charge, ...]
const posts = new Map(); // key -> every POST /charges, failed ones too
let calls = 0;

function readJson(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => {
      try { resolve(data ? JSON.parse(data) : {}); } catch (e) { reject(e); }
    });
  });
}

const server = http.createServer(async (req, res) => {
  const send = (status, body) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  if (req.method === 'POST' && req.url === '/charges') {
    const key = req.headers['idempotency-key'];
    const body = await readJson(req);
    const delay = Number(req.headers['x-provider-delay-ms'] || delayMs);
    await new Promise((r) => setTimeout(r, delay));
    posts.set(key, (posts.get(key) || 0) + 1);
    if (body.card === 'declined') return send(402, { error: 'card_declined' });
    if (body.card === 'flaky' && posts.get(key) === 1) return send(503, { error: 'try again later' });
    const charge = { id: `ch_${key}_${(charges.get(key) || []).length + 1}`, amount: body.amount };
    charges.set(key, [...(charges.get(key) || []), charge]);
    calls += 1;
    if (dropEvery > 0 && calls % dropEvery === 0) {
      req.socket.destroy(); // charged, but the reply is lost
      return;
    }
    return send(201, charge);
  }
  const m = req.url.match(/^\/charges\/(.+)$/);
  if (req.method === 'GET' && m) {
    const list = charges.get(decodeURIComponent(m[1]));
    return list ? send(200, list[0]) : send(404, { error: 'no such charge' });
  }
  if (req.method === 'GET' && req.url === '/calls') {
    return send(200, Object.fromEntries(posts));
  }
  if (req.method === 'GET' && req.url === '/stats') {
    return send(200, Object.fromEntries([...charges].map(([k, v]) => [k, v.length])));
  }
  send(404, { error: 'not found' });
});

server.listen(port, '127.0.0.1', () => {
  console.log(`provider listening on ${server.address().port}`);
});
