// The README's quick start, run as written: its SQL, its fastify and Express
// servers (each a program of its own, in a project where pg-idem, pg and the
// framework are installed) and its withIdempotency example.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');
const { call, until, newPool, randomUUID, receiver } = require('./support');

const pkgDir = path.join(__dirname, '..');
const blocks = [...fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8').matchAll(/^```(\w+)\n([\s\S]*?)^```$/gm)]
  .map(([, lang, code]) => ({ lang, code }));
const example = (lang, needle) => {
  const found = blocks.filter((b) => b.lang === lang && b.code.includes(needle));
  assert.equal(found.length, 1, `one ${lang} example with ${needle} in the README`);
  return found[0].code;
};

const pool = newPool();
let project;

before(async () => {
  await pool.query('DROP TABLE IF EXISTS orders');
  await pool.query(example('sql', 'CREATE TABLE orders'));
  // the agent example's budget, afresh (a run spends it)
  await pool.query(`DELETE FROM idem_budget WHERE tenant = 'demo' AND task = 'nightly-restock'`);
  await pool.query(example('sql', 'idem_budget('));
  // an application's project: its node_modules have what the README installs
  project = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-idem-readme-'));
  fs.mkdirSync(path.join(project, 'node_modules'));
  fs.symlinkSync(pkgDir, path.join(project, 'node_modules', 'pg-idem'));
  for (const dep of ['pg', 'fastify', 'express', 'zod', '@modelcontextprotocol']) {
    fs.symlinkSync(path.join(pkgDir, 'node_modules', dep), path.join(project, 'node_modules', dep));
  }
});
after(async () => {
  fs.rmSync(project, { recursive: true, force: true });
  await pool.query('DROP TABLE IF EXISTS orders');
  await pool.end();
});

const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
});

for (const framework of ['fastify', 'express']) {
  test(`the ${framework} quick start answers with and without a key`, async (t) => {
    const file = path.join(project, `${framework}.js`);
    fs.writeFileSync(file, example('js', `require('${framework}')`));
    const port = await freePort();
    const server = spawn(process.execPath, [file], { cwd: project, env: { ...process.env, PORT: String(port) }, stdio: 'pipe' });
    let output = '';
    server.stdout.on('data', (d) => { output += d; });
    server.stderr.on('data', (d) => { output += d; });
    const exited = new Promise((resolve) => server.on('exit', resolve));
    t.after(() => { server.kill(); return exited; });
    const url = `http://localhost:${port}`;
    await until(() => new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1', () => { socket.end(); resolve(true); }).on('error', () => resolve(false));
    }), `the ${framework} example to listen`);

    const plain = await call(url, '/orders', { body: { item: 'pen' } });
    assert.equal(plain.status, 201, `${plain.bytes}\n${output}`);
    assert.equal(plain.json().item, 'pen');
    const key = randomUUID();
    const first = await call(url, '/orders', { key, body: { item: 'book' } });
    assert.equal(first.status, 201, `${first.bytes}\n${output}`);
    const again = await call(url, '/orders', { key, body: { item: 'book' } });
    assert.equal(again.replayed, true);
    assert.deepEqual(again.bytes, first.bytes);
    const { rows } = await pool.query('SELECT id FROM orders WHERE id = ANY($1)', [[plain.json().id, first.json().id]]);
    assert.equal(rows.length, 2);
  });
}

test('the withIdempotency example', () => {
  const file = path.join(project, 'job.js');
  fs.writeFileSync(file, example('js', 'idem.withIdempotency('));
  // the example's key is fixed: its second run replays the first
  const first = execFileSync(process.execPath, [file], { cwd: project, encoding: 'utf8' });
  const second = execFileSync(process.execPath, [file], { cwd: project, encoding: 'utf8' });
  assert.match(first, /^(claimed|replay) \{"id":\d+\}\n$/);
  assert.match(second, /^replay \{"id":\d+\}\n$/);
});

test('the MCP server example: an agent\'s retries run the tool once, and each result says so', async (t) => {
  const file = path.join(project, 'mcp.js');
  fs.writeFileSync(file, example('js', 'registerIdempotentTool('));
  const client = new Client({ name: 'readme-agent', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: process.execPath, args: [file], cwd: project, env: { ...process.env }, stderr: 'pipe',
  }));
  t.after(() => client.close());
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((x) => x.name), ['place_order']);
  assert.ok(tools[0].inputSchema.required.includes('idempotency_key'));
  const key = randomUUID();
  const first = await client.callTool({ name: 'place_order', arguments: { item: 'lamp', idempotency_key: key } });
  const again = await client.callTool({ name: 'place_order', arguments: { item: 'lamp', idempotency_key: key } });
  assert.ok(!first.isError, JSON.stringify(first));
  assert.deepEqual(first.structuredContent.idempotency, { key, replayed: false });
  assert.deepEqual(again.structuredContent.idempotency, { key, replayed: true });
  assert.equal(again.structuredContent.order, first.structuredContent.order);
  assert.match(again.content.at(-1).text, /^idempotency: replayed/);
  const { rows } = await pool.query('SELECT item FROM orders WHERE id = $1', [first.structuredContent.order]);
  assert.deepEqual(rows, [{ item: 'lamp' }]);
  const { rows: [{ left }] } = await pool.query(
    `SELECT total - spent AS left FROM idem_budget WHERE tenant = 'demo' AND task = 'nightly-restock'`);
  assert.equal(left, 9, 'one execution, one unit spent');
});

test('the idempotentRequest example', async (t) => {
  let n = 0;
  const hook = await receiver(() => { n += 1; return n === 1 ? { status: 503 } : { status: 201, body: 'charged' }; });
  t.after(() => hook.close());
  const file = path.join(project, 'request.js');
  fs.writeFileSync(file, example('js', 'idem.idempotentRequest('));
  const out = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file], { cwd: project, env: { ...process.env, BILLING_URL: hook.url } });
    let text = '';
    child.stdout.on('data', (d) => { text += d; });
    child.stderr.on('data', (d) => { text += d; });
    child.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(text))));
  });
  assert.equal(out, 'succeeded 201 2\n');
  assert.deepEqual(hook.requests.map((r) => r.headers['idempotency-key']), ['charge-order-42', 'charge-order-42']);
});
