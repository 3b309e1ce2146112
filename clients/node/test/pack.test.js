// The artefact: `npm pack` gives a tarball that installs into an empty
// project (with pg, the peer dependency) and works there, as CommonJS, as
// an ES module, and with its types declared; the README's install commands
// (pg-idem is not on the registry) name that tarball.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const pkgDir = path.join(__dirname, '..');
const pgVersion = require('pg/package.json').version;

test('npm pack, as the README says, gives a tarball that installs and runs in a clean project', { timeout: 300000 }, () => {
  const readme = fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
  const install = readme.match(/^cd \S*clients\/node && npm pack\b.*\n^cd \S+ && npm install (\S+\.tgz) pg$/m);
  assert.ok(install, 'the README installs the tarball that npm pack writes in clients/node');
  const tarball = path.join(pkgDir, path.basename(install[1]));
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-idem-pack-'));
  try {
    // npm up to 11 prints an array of packages, npm 12 an object keyed by name
    const packed = JSON.parse(execFileSync('npm', ['pack', '--json'], { cwd: pkgDir }));
    const info = Array.isArray(packed) ? packed[0] : packed['pg-idem'];
    assert.equal(path.join(pkgDir, info.filename), tarball, 'the README names the tarball npm pack writes');
    const files = info.files.map((f) => f.path).sort();
    for (const f of ['index.js', 'index.mjs', 'index.d.ts', 'lib/core.js', 'lib/fastify.js', 'lib/express.js', 'lib/outbox.js', 'package.json', 'README.md']) {
      assert.ok(files.includes(f), `the tarball has ${f}: ${files.join(' ')}`);
    }
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/')), files.join(' '));
    const app = path.join(tmp, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true }));
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball, `pg@${pgVersion}`],
      { cwd: app, stdio: 'pipe' });
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
    fs.rmSync(tarball, { force: true });
  }
});
