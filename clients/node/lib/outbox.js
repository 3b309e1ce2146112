// pg-idem/lib/outbox.js: the outbox's client side.
//
//   await idem.enqueue(client, { tenant, topic: 'invoices', key, payload });  // in the business transaction
//   const d = idem.createDispatcher({ pool, topic: 'invoices', url: 'https://billing.example/hooks' });
//   await d.start();  ...  await d.stop();
//
// A dispatcher takes due messages with idem_take (autocommit: the lease is
// committed before anything leaves the process), delivers each (an HTTP POST
// or a handler) and records the answer with the attempt idem_take gave it.
// That attempt is the fencing token: a dispatcher whose lease ran out while
// it waited for the receiver cannot record over the attempt of the
// dispatcher that took the message after it (idem answers 55000).
'use strict';

const { setTimeout: sleep } = require('node:timers/promises');
const { responseBytes, qualifier } = require('./core');
const { classify, retryAfterMs } = require('./retry');

const ENQUEUE_SQL = (prefix, type) => `
  SELECT outcome, id, state, created_at
    FROM ${prefix}idem_enqueue($1, $2, $3, $4::${type}, headers => $5::jsonb, not_before => $6::timestamptz,
                               ordering_key => $7::text, max_attempts => $8::integer, redeliver => $9::boolean)`;

const TAKE_SQL = (prefix) => `
  SELECT id, tenant, topic, key, payload, headers, attempt, lease_expires_at
    FROM ${prefix}idem_take($1, max_messages => $2::integer, lease => $3::interval, tenant => $4::text)`;
const DELIVERED_SQL = (prefix) => `SELECT ${prefix}idem_delivered($1::bigint, $2::integer, $3::integer, $4::bytea)`;
const DELIVERED_MANY_SQL = (prefix) => `SELECT ${prefix}idem_delivered_many($1::bigint[], $2::integer[], $3::integer[], $4::bytea[])`;
const RETRY_SQL = (prefix) => `SELECT ${prefix}idem_retry($1::bigint, $2::integer, $3::text, $4::interval) AS state`;
const DEAD_SQL = (prefix) => `SELECT ${prefix}idem_dead($1::bigint, $2::integer, $3::text)`;
const PURGE_SQL = (prefix) => `SELECT ${prefix}idem_purge() AS purged`;

/** What idem raises when an attempt is not the message's live lease. */
const STALE = '55000';
/** How much of a receiver's error body goes into the message's last_error. */
const ERROR_BODY_CHARS = 200;

/**
 * A payload as idem_enqueue's argument: bytes as bytea, a string as text,
 * anything else as its JSON (jsonb).
 * @returns {[string, unknown]} the SQL type and the value
 */
function payloadArg(payload) {
  if (Buffer.isBuffer(payload)) return ['bytea', payload];
  if (payload instanceof Uint8Array) return ['bytea', Buffer.from(payload)];
  if (typeof payload === 'string') return ['text', payload];
  if (payload === undefined) throw new TypeError('pg-idem: enqueue needs a payload');
  return ['jsonb', JSON.stringify(payload)];
}

/**
 * Write an outbound message in the client's transaction: it is delivered
 * only if that transaction commits.
 * @param {import('pg').ClientBase} client a pg Client or PoolClient, inside the business transaction
 * @param {import('..').EnqueueOptions} message
 * @returns {Promise<import('..').Enqueued>}
 */
async function enqueue(client, message) {
  const { tenant, topic, key, payload, headers, notBefore, orderingKey, maxAttempts, redeliver, schema } = message;
  const [type, value] = payloadArg(payload);
  const { rows: [row] } = await client.query(ENQUEUE_SQL(qualifier(schema), type), [
    tenant, topic, key, value, headers == null ? null : JSON.stringify(headers), notBefore ?? null,
    orderingKey ?? null, maxAttempts ?? null, redeliver ?? true,
  ]);
  return { outcome: row.outcome, id: String(row.id), state: row.state, createdAt: row.created_at };
}

/**
 * What to record for a receiver's status, by the policy of lib/retry.js
 * (idempotentRequest's too): 2xx delivered; 408, 429 and 5xx worth retrying
 * (the receiver is busy or broken for now); anything else (3xx included: a
 * dispatcher does not follow redirects) dead.
 * @returns {{kind: 'delivered'|'retry'|'dead', status?: number|null, body?: Buffer|null, error?: string, after?: number|null}}
 */
function verdictOf(status, body, after) {
  const kind = status === null ? 'success' : classify(status);
  if (kind === 'success') return { kind: 'delivered', status, body };
  const text = body && body.length ? `: ${body.toString('utf8', 0, ERROR_BODY_CHARS)}` : '';
  const error = `HTTP ${status}${text}`;
  if (kind === 'retry') return { kind: 'retry', error, after };
  return { kind: 'dead', error };
}

/** A handler's result as a verdict: nothing (or no status) is delivered. */
function handlerVerdict(result) {
  const r = result || {};
  const status = r.status ?? null;
  if (status !== null && (!Number.isInteger(status) || status < 100 || status > 599)) {
    throw new TypeError(`pg-idem: the handler returned status ${status}, not an HTTP status`);
  }
  const after = r.retryAfter === undefined || r.retryAfter === null ? null : Number(r.retryAfter) * 1000;
  return verdictOf(status, responseBytes(r.body), after);
}

/** An error's message with its cause (fetch's "fetch failed" says nothing on its own). */
function describe(err) {
  const cause = err && err.cause;
  return cause ? `${err.message}: ${cause.code || cause.message || cause}` : String((err && err.message) || err);
}

/** A row of idem_take as the message a handler gets. */
function toMessage(row) {
  return {
    id: String(row.id),
    tenant: row.tenant,
    topic: row.topic,
    key: row.key,
    payload: row.payload,
    headers: row.headers || {},
    attempt: row.attempt,
    leaseExpiresAt: row.lease_expires_at,
    idempotencyKey: `${row.tenant}/${row.topic}/${row.key}`,
  };
}

function positive(name, value, fallback, integer) {
  const v = value ?? fallback;
  if (typeof v !== 'number' || !(v > 0) || (integer && !Number.isInteger(v))) {
    throw new TypeError(`pg-idem: ${name} must be a positive ${integer ? 'integer' : 'number'}, not ${value}`);
  }
  return v;
}

class Dispatcher {
  /** @param {import('..').DispatcherOptions} options */
  constructor(options = {}) {
    const { pool, topic, url, handler } = options;
    if (!pool || typeof pool.query !== 'function' || typeof pool.connect !== 'function') {
      throw new TypeError('pg-idem: the pool option must be a pg Pool');
    }
    if (typeof topic !== 'string' || topic === '') throw new TypeError('pg-idem: the topic option is required');
    if ((url === undefined) === (handler === undefined)) {
      throw new TypeError('pg-idem: give the dispatcher either url or handler');
    }
    if (handler !== undefined && typeof handler !== 'function') throw new TypeError('pg-idem: handler must be a function');
    this.pool = pool;
    this.topic = topic;
    // a URL that cannot be parsed would fail every attempt: refuse it now
    this.url = url === undefined ? null : new URL(String(url)).href;
    this.handler = handler || null;
    this.concurrency = positive('concurrency', options.concurrency, 4, true);
    this.batchSize = positive('batchSize', options.batchSize, this.concurrency, true);
    this.lease = positive('lease', options.lease, 30000, false);
    this.timeout = positive('timeout', options.timeout, 10000, false);
    this.pollInterval = positive('pollInterval', options.pollInterval, 1000, false);
    // an answer that comes after the lease ran out cannot be recorded: the
    // message went to another attempt, and this delivery was wasted
    if (this.timeout >= this.lease) {
      throw new RangeError(`pg-idem: the timeout (${this.timeout} ms) must be shorter than the lease (${this.lease} ms)`);
    }
    // where no background worker purges (the SQL edition, idem not
    // preloaded): idem_purge() every purgeInterval ms
    this.purgeInterval = options.purgeInterval == null ? null
      : positive('purgeInterval', options.purgeInterval, null, false);
    this.tenant = options.tenant ?? null;
    const prefix = qualifier(options.schema);
    this.sql = {
      take: TAKE_SQL(prefix), delivered: DELIVERED_SQL(prefix), deliveredMany: DELIVERED_MANY_SQL(prefix),
      retry: RETRY_SQL(prefix), dead: DEAD_SQL(prefix), purge: PURGE_SQL(prefix),
    };
    this.logger = options.logger || console;

    this.inFlight = new Set();
    this.running = false;
    this.started = null;
    this.stopping = null;
    this.loopDone = null;
    this.purging = null;
    this.listening = null;
    this.listener = null;
    this.wakeup = null;   // ends the loop's current wait
    this.woken = false;   // a wake-up that came while the loop was not waiting
    this.more = false;    // more messages may be due: take again when a slot frees
    this.halt = new AbortController();  // cuts the LISTEN client's reconnect pause short
    this.onNotification = (n) => this.notified(n);
  }

  /**
   * Start listening and delivering.  Resolves once the dispatcher LISTENs
   * (it delivers meanwhile, by polling).  A second call returns the first
   * call's promise; after stop() it rejects.
   * @returns {Promise<void>}
   */
  start() {
    if (this.stopping) return Promise.reject(new Error('pg-idem: this dispatcher was stopped; create a new one'));
    if (!this.started) {
      this.running = true;
      this.loopDone = this.loop();
      if (this.purgeInterval) this.purging = this.purgeLoop();
      this.listening = this.listen();
      this.started = this.listening;
    }
    return this.started;
  }

  /**
   * Stop taking messages; resolves once the deliveries in flight are
   * recorded and the LISTEN client is back in the pool.  Every call returns
   * the same promise.
   * @returns {Promise<void>}
   */
  stop() {
    if (!this.stopping) {
      this.stopping = (async () => {
        this.running = false;
        this.halt.abort();
        this.wake();
        await this.loopDone;
        await this.purging;
        await Promise.allSettled([...this.inFlight]);
        await this.listening;
        await this.unlisten();
      })();
    }
    return this.stopping;
  }

  /**
   * idem_purge() every purgeInterval ms until stop(): the purge never waits
   * for another transaction, and a failure is logged and tried again.
   */
  async purgeLoop() {
    for (;;) {
      try {
        await sleep(this.purgeInterval, undefined, { signal: this.halt.signal });
      } catch {
        return;   // stopped
      }
      try {
        const { rows } = await this.pool.query(this.sql.purge);
        if (Number(rows[0].purged) > 0) {
          this.logger.info(`pg-idem dispatcher ${this.topic}: idem_purge() deleted ${rows[0].purged}`);
        }
      } catch (e) {
        this.logger.error(`pg-idem dispatcher ${this.topic}: idem_purge() failed: ${describe(e)}`);
      }
    }
  }

  wake() {
    if (this.wakeup) this.wakeup();
    else this.woken = true;
  }

  /** Until wake() or `ms` passed. */
  wait(ms) {
    if (this.woken) {
      this.woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakeup = null;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wakeup = done;
    });
  }

  /** A notification on the LISTEN client: wake the loop for this topic's. */
  notified(n) {
    if (n.channel === 'idem_outbox' && n.payload === this.topic) {
      this.more = true;
      this.wake();
    }
  }

  /** Connect the LISTEN client, retrying every pollInterval until it works or the dispatcher stops. */
  async listen() {
    while (this.running) {
      const client = await this.pool.connect().catch((e) => {
        this.logger.error(`pg-idem dispatcher ${this.topic}: no connection to LISTEN on (${describe(e)}); polling meanwhile`);
      });
      if (client) {
        const listener = { client, onError: (err) => this.lost(listener, err) };
        client.on('notification', this.onNotification);
        client.on('error', listener.onError);
        try {
          await client.query('LISTEN idem_outbox');
          this.listener = listener;
          return;
        } catch (e) {
          this.logger.error(`pg-idem dispatcher ${this.topic}: LISTEN failed (${describe(e)}); polling meanwhile`);
          this.release(listener, e);
        }
      }
      await sleep(this.pollInterval, undefined, { signal: this.halt.signal }).catch(() => {});
    }
  }

  /** Give the LISTEN client back to the pool (`err`: as broken, to be closed). */
  release({ client, onError }, err) {
    client.removeListener('notification', this.onNotification);
    client.removeListener('error', onError);
    // a broken connection may report its end once more: unheard, an
    // 'error' event would throw
    if (err) client.on('error', () => {});
    client.release(err);
  }

  /** The LISTEN client's connection broke: drop it, connect another, and take what its notifications missed. */
  lost(listener, err) {
    if (this.listener !== listener) return;
    this.listener = null;
    this.release(listener, err);
    if (!this.running) return;
    this.logger.warn(`pg-idem dispatcher ${this.topic}: the LISTEN connection broke (${describe(err)}); reconnecting`);
    this.listening = this.listen().then(() => this.wake());
  }

  async unlisten() {
    const listener = this.listener;
    if (!listener) return;
    this.listener = null;
    try {
      await listener.client.query('UNLISTEN idem_outbox');
      this.release(listener);
    } catch (e) {
      this.release(listener, e);
    }
  }

  /** Take while slots are free and messages due; wait for a notification, a free slot or the poll interval. */
  async loop() {
    while (this.running) {
      const free = this.concurrency - this.inFlight.size;
      if (free > 0) {
        // no more than the free slots: a message taken waits for no slot
        // while its lease runs
        const n = Math.min(this.batchSize, free);
        this.more = false;
        try {
          const { rows } = await this.pool.query(this.sql.take, [this.topic, n, `${this.lease} milliseconds`, this.tenant]);
          if (rows.length) this.deliverBatch(rows.map(toMessage));
          if (rows.length === n) this.more = true;
        } catch (e) {
          this.logger.error(`pg-idem dispatcher ${this.topic}: idem_take failed: ${describe(e)}`);
        }
        if (this.more && this.inFlight.size < this.concurrency) continue;
      }
      if (this.running) await this.wait(this.pollInterval);
    }
  }

  track(delivery) {
    this.inFlight.add(delivery);
    delivery.finally(() => {
      this.inFlight.delete(delivery);
      if (this.more) this.wake();
    });
  }

  /**
   * Deliver a take's messages at once.  A retry or a death is recorded as
   * soon as its answer is in; the deliveries are recorded together, by one
   * idem_delivered_many, once every answer of the batch is in (each within
   * the timeout, so within its lease).  A slot frees when its message's
   * answer is recorded.
   */
  deliverBatch(messages) {
    const answers = messages.map((message) => this.attempt(message));
    const recorded = answers.map((answer, i) => answer.then((verdict) => (
      verdict.kind === 'delivered' ? null : this.record(messages[i], verdict))));
    const delivered = Promise.all(answers).then((verdicts) => this.recordDelivered(
      messages.map((message, i) => ({ message, verdict: verdicts[i] })).filter(({ verdict }) => verdict.kind === 'delivered')));
    for (const r of recorded) this.track(Promise.all([r, delivered]).then(() => {}));
  }

  /** Deliver one message: its verdict; never rejects. */
  async attempt(message) {
    try {
      return this.url ? await this.post(message) : await this.call(message);
    } catch (e) {
      return { kind: 'retry', error: describe(e), after: null };
    }
  }

  /**
   * Record a batch's deliveries, statuses and bodies with one
   * idem_delivered_many call; when it is refused for a stale lease (55000:
   * nothing of it is written), each by itself, so that the live ones are
   * recorded.  Never rejects.
   */
  async recordDelivered(batch) {
    if (batch.length === 0) return;
    try {
      await this.pool.query(this.sql.deliveredMany, [
        batch.map(({ message }) => message.id), batch.map(({ message }) => message.attempt),
        batch.map(({ verdict }) => verdict.status), batch.map(({ verdict }) => verdict.body ?? null)]);
      for (const { message, verdict } of batch) {
        this.logger.info(`pg-idem dispatcher: ${message.idempotencyKey} attempt ${message.attempt}: delivered${
          verdict.status === null ? '' : ` (${verdict.status})`}`);
      }
    } catch (e) {
      if (e.code !== STALE) {
        this.logger.error(`pg-idem dispatcher ${this.topic}: recording ${batch.length} deliveries failed: ${describe(e)}`);
        return;
      }
      await Promise.all(batch.map(({ message, verdict }) => this.record(message, verdict)));
    }
  }

  /** url mode: POST the payload with the key; a timeout or a broken connection is retried. */
  async post(message) {
    let headers;
    try {
      headers = new Headers();
      for (const [name, value] of Object.entries(message.headers)) {
        for (const v of [].concat(value)) headers.append(name, String(v));
      }
      headers.set('Idempotency-Key', message.idempotencyKey);
      headers.set('Idem-Attempt', String(message.attempt));
      if (!headers.has('Content-Type')) headers.set('Content-Type', 'application/octet-stream');
    } catch (e) {
      // a header HTTP cannot carry: no attempt could ever send it
      return { kind: 'dead', error: `the message cannot be sent: ${e.message}` };
    }
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), this.timeout);
    try {
      const res = await fetch(this.url, {
        method: 'POST', headers, body: message.payload, redirect: 'manual', signal: controller.signal,
      });
      const body = Buffer.from(await res.arrayBuffer());
      return verdictOf(res.status, body, retryAfterMs(res.headers.get('retry-after')));
    } catch (e) {
      const error = controller.signal.aborted ? `no answer within ${this.timeout} ms` : describe(e);
      return { kind: 'retry', error, after: null };
    } finally {
      clearTimeout(timer);
    }
  }

  /** handler mode: the handler's signal aborts after `timeout`; what it returns is recorded even so. */
  async call(message) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new Error(`no answer within ${this.timeout} ms`)), this.timeout);
    try {
      return handlerVerdict(await this.handler(message, { signal: controller.signal }));
    } finally {
      clearTimeout(timer);
    }
  }

  /** Record a verdict with the message's own attempt; a stale lease is a warning, not an error. */
  async record(message, verdict) {
    const who = `pg-idem dispatcher: ${message.idempotencyKey} attempt ${message.attempt}`;
    const { id, attempt } = message;
    try {
      if (verdict.kind === 'delivered') {
        await this.pool.query(this.sql.delivered, [id, attempt, verdict.status, verdict.body]);
        this.logger.info(`${who}: delivered${verdict.status === null ? '' : ` (${verdict.status})`}`);
      } else if (verdict.kind === 'retry') {
        const after = verdict.after === null ? null : `${Math.round(verdict.after)} milliseconds`;
        const { rows: [{ state }] } = await this.pool.query(this.sql.retry, [id, attempt, verdict.error, after]);
        if (state === 'dead') this.logger.error(`${who}: dead, its last attempt failed: ${verdict.error}`);
        else this.logger.warn(`${who}: to retry${after ? ` after ${after}` : ''}: ${verdict.error}`);
      } else {
        await this.pool.query(this.sql.dead, [id, attempt, verdict.error]);
        this.logger.error(`${who}: dead: ${verdict.error}`);
      }
    } catch (e) {
      if (e.code === STALE) {
        this.logger.warn(`${who}: stale lease, the answer (${verdict.kind}) is not recorded: ${e.message}`);
      } else {
        this.logger.error(`${who}: recording the answer (${verdict.kind}) failed: ${describe(e)}`);
      }
    }
  }
}

/**
 * A dispatcher of one topic's messages: `start()`, `stop()`.
 * @param {import('..').DispatcherOptions} options
 * @returns {Dispatcher}
 */
function createDispatcher(options) {
  return new Dispatcher(options);
}

module.exports = { enqueue, createDispatcher };
