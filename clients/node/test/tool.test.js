// registerIdempotentTool: an MCP tool on an McpServer of
// @modelcontextprotocol/sdk, called by the SDK's Client over an in-memory
// transport, as an agent calls it.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { McpServer } = require('@modelcontextprotocol/sdk/server/mcp.js');
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { InMemoryTransport } = require('@modelcontextprotocol/sdk/inMemory.js');
const { z } = require('zod');
const { registerIdempotentTool } = require('..');
const { setupDatabase, newPool, randomUUID, sleep } = require('./support');

const pool = newPool();
before(() => setupDatabase(pool));
after(() => pool.end());

/** An McpServer with `register(server)`'s tools, and a Client connected to it. */
async function connect(register) {
  const server = new McpServer({ name: 'test-tools', version: '1.0.0' });
  register(server);
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: 'test-agent', version: '1.0.0' });
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  return { client, close: async () => { await client.close(); await server.close(); } };
}

const textOf = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

test('the same key 5 times (2 of them concurrent): the handler runs once, 4 answers say replayed', async (t) => {
  const tenant = `t-${randomUUID()}`;
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server, { pool, tenant }, 'place_order', {
    description: 'Place an order',
    inputSchema: { item: z.string(), quantity: z.number().int() },
  }, async ({ item, quantity }, extra) => {
    runs += 1;
    await sleep(300);  // long enough for the concurrent call to wait for it
    const { rows: [row] } = await extra.idem.client.query(
      `INSERT INTO items (app, idem_key, nonce) VALUES ('tool', $1, $2) RETURNING id`, [extra.idem.key, `${item} x${quantity}`]);
    return { content: [{ type: 'text', text: `order ${row.id} placed` }], structuredContent: { order: row.id } };
  }));
  t.after(close);
  const key = randomUUID();
  const args = { item: 'pen', quantity: 2, idempotency_key: key };
  const call = () => client.callTool({ name: 'place_order', arguments: args });
  const [a, b] = await Promise.all([call(), call()]);
  const rest = [await call(), await call(), await call()];
  const all = [a, b, ...rest];
  assert.equal(runs, 1);
  for (const r of all) {
    assert.ok(!r.isError, textOf(r));
    assert.equal(r.structuredContent.idempotency.key, key);
    assert.equal(r.structuredContent.order, a.structuredContent.order);
    assert.equal(r.content[0].text, a.content[0].text);
  }
  assert.equal(all.filter((r) => r.structuredContent.idempotency.replayed).length, 4);
  assert.equal(all.filter((r) => !r.structuredContent.idempotency.replayed).length, 1);
  assert.ok(all.some((r) => textOf(r).includes(`idempotency: executed now (key ${key})`)));
  assert.equal(all.filter((r) => /idempotency: replayed/.test(textOf(r))).length, 4);
  const { rows } = await pool.query('SELECT count(*)::int AS n FROM items WHERE idem_key = $1', [key]);
  assert.equal(rows[0].n, 1);
  const { rows: [rec] } = await pool.query(
    `SELECT state, attempt FROM idem_list($1, 'tool:place_order', max_rows => 100000) WHERE key = $2`, [tenant, key]);
  assert.deepEqual(rec, { state: 'succeeded', attempt: 1 });
  // other arguments under the key: refused, nothing run
  const other = await client.callTool({ name: 'place_order', arguments: { ...args, quantity: 3 } });
  assert.equal(other.isError, true);
  assert.equal(other.structuredContent.idempotency.outcome, 'mismatch');
  assert.equal(runs, 1);
});

test('the input schema requires idempotency_key (1-255 characters); a call without it is refused', async (t) => {
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server, { pool, tenant: 'acme' }, 'send_mail', {
    inputSchema: { to: z.string() },
  }, async () => { runs += 1; return { content: [{ type: 'text', text: 'sent' }] }; }));
  t.after(close);
  const { tools } = await client.listTools();
  const schema = tools.find((x) => x.name === 'send_mail').inputSchema;
  assert.ok(schema.required.includes('idempotency_key'), JSON.stringify(schema));
  assert.equal(schema.properties.idempotency_key.maxLength, 255);
  const missing = await client.callTool({ name: 'send_mail', arguments: { to: 'a@example.org' } })
    .catch((e) => ({ isError: true, content: [{ type: 'text', text: e.message }] }));
  assert.equal(missing.isError, true);
  assert.match(textOf(missing), /idempotency_key/);
  const long = await client.callTool({ name: 'send_mail', arguments: { to: 'a', idempotency_key: 'k'.repeat(256) } })
    .catch((e) => ({ isError: true, content: [{ type: 'text', text: e.message }] }));
  assert.equal(long.isError, true);
  assert.equal(runs, 0);
});

test('a handler that throws is not stored: the next call with the key runs it again', async (t) => {
  const tenant = `t-${randomUUID()}`;
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server, { pool, tenant }, 'flaky', {
    inputSchema: { n: z.number() },
  }, async (args, extra) => {
    runs += 1;
    await extra.idem.client.query(`INSERT INTO items (app, idem_key, nonce) VALUES ('tool', $1, 'flaky')`, [extra.idem.key]);
    if (runs === 1) throw new Error('the payment service went away');
    return { content: [{ type: 'text', text: `ok on attempt ${extra.idem.attempt}` }] };
  }));
  t.after(close);
  const key = randomUUID();
  const first = await client.callTool({ name: 'flaky', arguments: { n: 1, idempotency_key: key } });
  assert.equal(first.isError, true);
  assert.match(textOf(first), /the payment service went away/);
  assert.equal(first.structuredContent.idempotency.replayed, false);
  const second = await client.callTool({ name: 'flaky', arguments: { n: 1, idempotency_key: key } });
  assert.ok(!second.isError, textOf(second));
  assert.equal(second.content[0].text, 'ok on attempt 2');
  const third = await client.callTool({ name: 'flaky', arguments: { n: 1, idempotency_key: key } });
  assert.equal(third.structuredContent.idempotency.replayed, true);
  assert.equal(runs, 2);
  // the failed run's writes were rolled back
  const { rows } = await pool.query('SELECT count(*)::int AS n FROM items WHERE idem_key = $1', [key]);
  assert.equal(rows[0].n, 1);
});

test('with a task, each execution spends one unit of its budget; an exhausted budget runs nothing', async (t) => {
  const tenant = `t-${randomUUID()}`;
  const task = `task-${randomUUID()}`;
  await pool.query('SELECT idem_budget($1, $2, 2)', [tenant, task]);
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server, { pool, tenant, task }, 'refund', {
    inputSchema: { amount: z.number() },
    outputSchema: { refunded: z.number() },
  }, async ({ amount }, extra) => {
    runs += 1;
    return { content: [{ type: 'text', text: `refunded ${amount}, ${extra.idem.budgetLeft} left` }], structuredContent: { refunded: amount } };
  }));
  t.after(close);
  const call = (key, amount = 5) => client.callTool({ name: 'refund', arguments: { amount, idempotency_key: key } });
  const k1 = randomUUID();
  const a = await call(k1);
  assert.ok(!a.isError, textOf(a));
  assert.deepEqual(a.structuredContent, { refunded: 5, idempotency: { key: k1, replayed: false } });
  assert.match(textOf(a), /1 left/);
  const replay = await call(k1);  // a replay spends nothing
  assert.equal(replay.structuredContent.idempotency.replayed, true);
  const b = await call(randomUUID(), 6);
  assert.ok(!b.isError, textOf(b));
  assert.match(textOf(b), /0 left/);
  const k3 = randomUUID();
  const c = await call(k3, 7);
  assert.equal(c.isError, true);
  assert.match(textOf(c), /budget/);
  assert.equal(c.structuredContent.idempotency.outcome, 'budget_exhausted');
  assert.equal(runs, 2);
  const { rows } = await pool.query(`SELECT count(*)::int AS n FROM idem_list($1, 'tool:refund', max_rows => 100000) WHERE key = $2`, [tenant, k3]);
  assert.equal(rows[0].n, 0, 'a refused spend stores nothing');
});

test('tenant as a function of the arguments; the stored result is the handler\'s own', async (t) => {
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server,
    { pool, tenant: (args) => `shop-${args.shop}` }, 'restock', { inputSchema: { shop: z.string() } },
    async () => { runs += 1; return { content: [{ type: 'text', text: `run ${runs}` }] }; }));
  t.after(close);
  const key = randomUUID();
  const a = await client.callTool({ name: 'restock', arguments: { shop: 'a', idempotency_key: key } });
  const b = await client.callTool({ name: 'restock', arguments: { shop: 'b', idempotency_key: key } });
  assert.equal(runs, 2, 'one key, two tenants: two requests');
  assert.equal(a.content[0].text, 'run 1');
  assert.equal(b.content[0].text, 'run 2');
  const { rows: [rec] } = await pool.query(
    `SELECT body FROM idem_list('shop-a', 'tool:restock', true, 100000) WHERE key = $1`, [key]);
  assert.deepEqual(JSON.parse(rec.body), { content: [{ type: 'text', text: 'run 1' }] });
});

test('a frozen tool answers isError with the reason and runs nothing', async (t) => {
  const tenant = `t-${randomUUID()}`;
  let runs = 0;
  const { client, close } = await connect((server) => registerIdempotentTool(server, { pool, tenant }, 'wire', {
    inputSchema: { amount: z.number() },
  }, async () => { runs += 1; return { content: [] }; }));
  t.after(close);
  await pool.query(`SELECT idem_freeze($1, 'tool:wire', 'double wires under investigation')`, [tenant]);
  const r = await client.callTool({ name: 'wire', arguments: { amount: 1, idempotency_key: randomUUID() } });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.idempotency.outcome, 'frozen');
  assert.match(textOf(r), /double wires under investigation/);
  assert.equal(runs, 0);
  await pool.query(`SELECT idem_thaw($1, 'tool:wire')`, [tenant]);
});

test('the traceparent of the request\'s _meta is idem.trace of the claim\'s transaction; the logger gets the decision', async (t) => {
  const lines = [];
  const { client, close } = await connect((server) => registerIdempotentTool(server,
    { pool, tenant: 'acme', logger: (fields) => lines.push(fields) }, 'traced', { inputSchema: {} },
    async (args, extra) => {
      const { rows: [{ trace }] } = await extra.idem.client.query(`SELECT current_setting('idem.trace', true) AS trace`);
      return { content: [{ type: 'text', text: trace }] };
    }));
  t.after(close);
  const key = randomUUID();
  const trace = '0af7651916cd43dd8448eb211c80319c';
  const r = await client.callTool({ name: 'traced', arguments: { idempotency_key: key }, _meta: { traceparent: `00-${trace}-b7ad6b7169203331-01` } });
  assert.equal(r.content[0].text, trace);
  assert.deepEqual(lines, [{ idempotency_key: key, tenant: 'acme', endpoint: 'tool:traced', outcome: 'claimed', attempt: 1, trace_id: trace }]);
});

test('zod 3 shapes (zod/v3) and z.object schemas, a strict outputSchema included, get idempotency_key and idempotency', async (t) => {
  const z3 = require('zod/v3').z;
  const { client, close } = await connect((server) => {
    registerIdempotentTool(server, { pool, tenant: 'acme' }, 'v3', { inputSchema: { a: z3.number() }, outputSchema: { a: z3.number() } },
      async ({ a }) => ({ content: [], structuredContent: { a } }));
    registerIdempotentTool(server, { pool, tenant: 'acme' }, 'v4object',
      { inputSchema: z.object({ a: z.number() }), outputSchema: z.object({ a: z.number() }).strict() },
      async ({ a }) => ({ content: [], structuredContent: { a } }));
  });
  t.after(close);
  const { tools } = await client.listTools();
  for (const tool of tools) {
    assert.deepEqual(tool.inputSchema.required.sort(), ['a', 'idempotency_key'], tool.name);
    assert.ok(tool.outputSchema.properties.idempotency, tool.name);
  }
  for (const name of ['v3', 'v4object']) {
    const key = randomUUID();
    const r = await client.callTool({ name, arguments: { a: 2, idempotency_key: key } });
    assert.ok(!r.isError, JSON.stringify(r));
    assert.deepEqual(r.structuredContent, { a: 2, idempotency: { key, replayed: false } });
  }
});
