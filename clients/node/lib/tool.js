// pg-idem/lib/tool.js: a side-effecting agent tool (an MCP tool on an
// @modelcontextprotocol/sdk McpServer) that runs once per idempotency key.
//
//   idem.registerIdempotentTool(server, { pool, tenant: 'acme', task: 'order-42' }, 'charge', {
//     description: 'Charge a card',
//     inputSchema: { amount: z.number() },      // + idempotency_key, required
//   }, async ({ amount }, extra) => {
//     await extra.idem.client.query('INSERT ...');   // the claim's transaction
//     return { content: [{ type: 'text', text: `charged ${amount}` }] };
//   });
//
// Each call claims (tenant, `tool:<name>`, idempotency_key) with the
// arguments' fingerprint and waits for a concurrent call of the same key.
// The first call runs the handler in the claim's transaction and stores its
// result (a CallToolResult, as JSON); every repeat returns that result
// without running it.  A handler that throws, or returns isError, is
// recorded as a retryable failure: the next call with the key runs it
// again.  With a task, each execution spends one unit of the task's budget
// (idem_spend) in the same transaction.  Every result says which it was,
// in `structuredContent.idempotency` ({key, replayed}) and in a last text
// line of its content: agents rarely see anything but the result.
'use strict';

const { randomUUID } = require('node:crypto');
const core = require('./core');
const trace = require('./trace');

/** idem_spend: the budget cannot cover the spend. */
const BUDGET_SPENT = 'IB001';
/** idem_spend: the task has no budget (idem_budget was not called, or it expired). */
const NO_BUDGET = '42704';

const isV4 = (s) => Boolean(s && s._zod);
const isV3 = (s) => Boolean(s && s._def && !s._zod);

/** A zod schema object (not a raw shape): z.object(...) of zod 3 or 4. */
function isZodObject(s) {
  if (isV4(s)) return Boolean(s._zod.def && s._zod.def.type === 'object');
  return isV3(s) && typeof s.extend === 'function' && s.shape !== undefined;
}

/**
 * The application's zod, in the version its schema uses: the module of
 * zod 4 (`zod/v4`) for zod 4 schemas, zod 3 (`zod/v3`) for zod 3 ones (zod
 * ^3.25 and ^4 both have both), the package's default for none.
 */
function zodFor(schemas, given) {
  if (given) return given.z || given;
  const all = schemas.filter(Boolean);
  let mod;
  if (all.length && all.every(isV4)) mod = require('zod/v4');
  else if (all.length && all.every(isV3)) mod = require('zod/v3');
  else if (all.length) throw new TypeError('pg-idem: the tool\'s schema mixes zod 3 and zod 4; pass `zod` in the options');
  else mod = require('zod');
  return mod.z || mod;
}

/** The schemas of a raw shape or of a zod object. */
function schemasOf(schema) {
  if (schema === undefined || schema === null) return [];
  if (isV4(schema) || isV3(schema)) return [schema];
  return Object.values(schema);
}

/** `schema` (a raw shape, a zod object or nothing) with `extra` fields added. */
function extend(schema, extra, what) {
  if (schema === undefined || schema === null) return { ...extra };
  for (const name of Object.keys(extra)) {
    const shape = isZodObject(schema) ? (isV4(schema) ? schema._zod.def.shape : schema.shape) : schema;
    if (shape && Object.prototype.hasOwnProperty.call(shape, name)) {
      throw new TypeError(`pg-idem: the tool's ${what} already has a field ${name}`);
    }
  }
  if (isZodObject(schema)) return schema.extend(extra);
  if (isV4(schema) || isV3(schema)) {
    throw new TypeError(`pg-idem: the tool's ${what} must be a zod raw shape or z.object(...)`);
  }
  return { ...schema, ...extra };
}

/** The trace of a tool call: the traceparent of the request's _meta, else a new id. */
function callTrace(extra) {
  const meta = (extra && extra._meta) || {};
  return trace.traceIdOf(meta.traceparent) || randomUUID();
}

/** A stored result (JSON bytes) as the CallToolResult it was. */
function storedResult(body) {
  try {
    const r = JSON.parse(Buffer.isBuffer(body) ? body.toString('utf8') : String(body));
    return r && typeof r === 'object' ? r : { content: [] };
  } catch {
    return { content: [{ type: 'text', text: String(body) }] };
  }
}

/** What a handler returned, as a CallToolResult (nothing: no content). */
function toolResult(r) {
  if (r === undefined || r === null) return { content: [] };
  if (typeof r !== 'object' || Array.isArray(r)) {
    throw new TypeError('pg-idem: a tool handler must return a CallToolResult ({content: [...]})');
  }
  return Array.isArray(r.content) ? r : { ...r, content: [] };
}

/**
 * `result` with the idempotency of the call: `structuredContent.idempotency`
 * and a last text line.
 */
function decorate(result, idempotency, line) {
  const structured = result.structuredContent && typeof result.structuredContent === 'object'
    && !Array.isArray(result.structuredContent) ? result.structuredContent : {};
  return {
    ...result,
    content: [...(Array.isArray(result.content) ? result.content : []), { type: 'text', text: line }],
    structuredContent: { ...structured, idempotency },
  };
}

/** An isError result of a call that did not execute the tool (or failed in it). */
function errorResult(key, outcome, text) {
  return decorate({ content: [{ type: 'text', text }], isError: true }, { key, replayed: false, outcome },
    `idempotency: ${outcome === 'failed' ? 'executed now and failed' : 'not executed'} (key ${key})`);
}

/** What the agent reads for an outcome that does not execute. */
function refusal(outcome, claim, name) {
  switch (outcome) {
    case 'in_progress':
      return `another call of ${name} with this idempotency_key is still running; call again later with the same key`;
    case 'mismatch':
      return `this idempotency_key was already used for ${name} with other arguments; `
        + 'use a new key for a new request, or the same arguments to get the first result';
    case 'unknown':
      return `an earlier call of ${name} with this idempotency_key did not finish and may have taken effect; `
        + 'it must be reconciled before the key can be used again';
    case 'frozen':
      return `${name} is frozen${claim.until ? ` until ${new Date(claim.until).toISOString()}` : ''}`
        + `${claim.reason ? `: ${claim.reason}` : ''}; nothing was done. Do not retry now`;
    default:
      return `idem answered ${outcome}; nothing was done`;
  }
}

async function resolveOption(option, args, extra) {
  return typeof option === 'function' ? option(args, extra) : option;
}

/**
 * Register `name` on an McpServer so that it runs once per idempotency key.
 * @param {{registerTool: Function}} server an @modelcontextprotocol/sdk McpServer
 * @param {import('..').ToolOptions} options
 * @param {string} name
 * @param {object} config registerTool's config; `inputSchema` a zod raw shape (or z.object)
 * @param {(args: object, extra: object) => Promise<object>|object} handler
 * @returns {unknown} what server.registerTool returns (the RegisteredTool)
 */
function registerIdempotentTool(server, options, name, config, handler) {
  if (!server || typeof server.registerTool !== 'function') {
    throw new TypeError('pg-idem: registerIdempotentTool needs an McpServer (@modelcontextprotocol/sdk >= 1.17)');
  }
  const { pool, tenant, task = null } = options || {};
  if (!pool || typeof pool.connect !== 'function') throw new TypeError('pg-idem: the pool option must be a pg Pool');
  if (tenant === undefined || tenant === null || tenant === '') throw new TypeError('pg-idem: the tenant option is required');
  if (typeof name !== 'string' || name === '') throw new TypeError('pg-idem: the tool needs a name');
  if (typeof handler !== 'function') throw new TypeError('pg-idem: the tool needs a handler');
  const schema = options.schema ?? null;
  core.qualifier(schema);
  const waitTimeout = options.wait === undefined || options.wait === true ? 60000 : Number(options.wait || 0);
  const logger = options.logger || null;
  const endpoint = `tool:${name}`;
  const cfg = config || {};
  const z = zodFor([...schemasOf(cfg.inputSchema), ...schemasOf(cfg.outputSchema)], options.zod);
  const keySchema = z.string().min(1).max(core.MAX_KEY_LENGTH).describe(
    'A key of your own for this request (1-255 characters): the same key on every retry of it, '
    + 'a new key for a new request. A call with a key used before returns the first call\'s result '
    + 'without running the tool again.');
  const registered = {
    ...cfg,
    inputSchema: extend(cfg.inputSchema, { idempotency_key: keySchema }, 'inputSchema'),
  };
  if (cfg.outputSchema !== undefined && cfg.outputSchema !== null) {
    registered.outputSchema = extend(cfg.outputSchema,
      { idempotency: z.object({ key: z.string(), replayed: z.boolean() }).passthrough() }, 'outputSchema');
  }

  async function call(args, extra) {
    const { idempotency_key: key, ...input } = args || {};
    const who = await resolveOption(tenant, args, extra);
    if (typeof who !== 'string' || who === '') throw new TypeError('pg-idem: the tenant must be a non-empty string');
    const taskName = task === null ? null : await resolveOption(task, args, extra);
    const scope = { schema, tenant: who, endpoint, key, trace: callTrace(extra) };
    const fingerprint = Buffer.from(core.canonicalJson(input));
    const client = await pool.connect();
    let claim;
    try {
      await client.query('BEGIN');
      await core.setTrace(client, scope.trace);
      claim = await core.claimKey(client, { ...scope, fingerprint, wait: waitTimeout > 0, waitTimeout });
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {});
      client.release();
      throw e;
    }
    trace.logDecision(logger, trace.decisionFields(scope, claim, scope.trace));
    if (claim.outcome !== 'claimed') {
      try {
        await client.query('ROLLBACK');
        if (claim.outcome === 'frozen') Object.assign(claim, await core.frozenInfo(client, scope));
      } finally {
        client.release();
      }
      if (claim.outcome === 'replay') {
        return decorate(storedResult(claim.body), { key, replayed: true },
          `idempotency: replayed the result of an earlier call with this key (key ${key}); the tool did not run again`);
      }
      return errorResult(key, claim.outcome, refusal(claim.outcome, claim, name));
    }
    try {
      let budgetLeft = null;
      if (taskName !== null && taskName !== undefined) {
        try {
          ({ rows: [{ left: budgetLeft }] } = await client.query(
            `SELECT ${core.qualifier(schema)}idem_spend($1, $2, 1) AS left`, [who, taskName]));
        } catch (e) {
          await client.query('ROLLBACK');
          if (e.code === BUDGET_SPENT) {
            return errorResult(key, 'budget_exhausted', `the retry budget of task ${taskName} is exhausted, `
              + `so ${name} was not run: ${e.message}${e.detail ? ` ${e.detail}` : ''} Stop retrying this task and report it.`);
          }
          if (e.code === NO_BUDGET) {
            return errorResult(key, 'no_budget', `task ${taskName} has no retry budget, so ${name} was not run: ${e.message}`);
          }
          throw e;
        }
      }
      await client.query('SAVEPOINT idem_handler');
      let result;
      let thrown;
      try {
        result = toolResult(await handler(input, {
          ...extra,
          idem: {
            client, tenant: who, endpoint, key, attempt: claim.attempt, expiresAt: claim.expires_at,
            task: taskName, budgetLeft, trace: scope.trace,
          },
        }));
      } catch (e) {
        thrown = e;
      }
      if (thrown !== undefined || result.isError) {
        // the tool's error: its writes rolled back, a retryable failure
        // recorded (the budget stays spent: it was an execution)
        await core.finishClaim(client, claim, scope, { status: 500, headers: {}, body: null }, { store: false });
        await client.query('COMMIT');
        if (thrown !== undefined) {
          return errorResult(key, 'failed', `${name} failed: ${(thrown && thrown.message) || thrown}. `
            + 'Nothing was stored: a call with the same idempotency_key runs it again.');
        }
        return decorate(result, { key, replayed: false },
          `idempotency: executed now and failed (key ${key}); a call with this key runs the tool again`);
      }
      await core.finishClaim(client, claim, scope,
        { status: 200, headers: { 'Content-Type': 'application/json' }, body: Buffer.from(JSON.stringify(result)) });
      await client.query('COMMIT');
      return decorate(result, { key, replayed: false }, `idempotency: executed now (key ${key})`);
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {});
      throw e;
    } finally {
      client.release();
    }
  }

  return server.registerTool(name, registered, call);
}

module.exports = { registerIdempotentTool };
