// The artefact: `npm pack` gives a tarball that installs into an empty
// project (with pg, the peer dependency) and works there, as CommonJS, as
// an ES module, and with its types declared.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const pkgDir = path.join(__dirname, '..');
const pgVersion = require('pg/package.json').version;

test('npm pack gives a tarball that installs and runs in a clean project', { timeout: 300000 }, () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-idem-pack-'));
  try {
    // npm up to 11 prints an array of packages, npm 12 an object keyed by name
    const packed = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', tmp], { cwd: pkgDir }));
    const info = Array.isArray(packed) ? packed[0] : packed['pg-idem'];
    const files = info.files.map((f) => f.path).sort();
    for (const f of ['index.js', 'index.mjs', 'index.d.ts', 'lib/core.js', 'lib/fastify.js', 'lib/express.js', 'lib/outbox.js', 'package.json', 'README.md']) {
      assert.ok(files.includes(f), `the tarball has ${f}: ${files.join(' ')}`);
    }
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/')), files.join(' '));
    const app = path.join(tmp, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true }));
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline',
      path.join(tmp, info.filename), `pg@${pgVersion}`], { cwd: app, stdio: 'pipe' });
    fs.writeFileSync(path.join(app, 'app.js'), `
      const { Pool } = require('pg');
      const idem = require('pg-idem');
      (async () => {
        const esm = await import('pg-idem');
        const pool = new Pool();
        const key = require('node:crypto').randomUUID();
        const run = () => idem.withIdempotency(pool, { tenant: 'pack', endpoint: 'job', key },
          async () => ({ status: 200, body: 'packed' }));
        const a = await run();
        const b = await run();
        const client = await pool.connect();
        const e = await idem.enqueue(client, { tenant: 'pack', topic: 'pack', key, payload: 'x' });
        client.release();
        await pool.end();
        console.log(JSON.stringify({ a: a.outcome, b: b.outcome, body: String(b.body), enqueued: e.outcome,
          esm: typeof esm.withIdempotency === 'function' && esm.fastify === idem.fastify
            && esm.createDispatcher === idem.createDispatcher,
          express: typeof idem.express, from: require.resolve('pg-idem') }));
      })().catch((e) => { console.error(e); process.exit(1); });
    `);
    const out = JSON.parse(execFileSync(process.execPath, ['app.js'], { cwd: app, env: process.env }));
    assert.deepEqual({ ...out, from: undefined }, { a: 'claimed', b: 'replay', body: 'packed', enqueued: 'enqueued', esm: true, express: 'function', from: undefined });
    assert.ok(out.from.startsWith(path.join(app, 'node_modules', 'pg-idem')), out.from);
    const types = JSON.parse(fs.readFileSync(path.join(app, 'node_modules', 'pg-idem', 'package.json'))).types;
    assert.ok(fs.existsSync(path.join(app, 'node_modules', 'pg-idem', types)));
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
