// A dispatcher process for outbox-e2e.test.js: createDispatcher in url mode,
// configured by the environment (E2E_TOPIC, E2E_URL, E2E_LEASE, E2E_TIMEOUT,
// E2E_POLL, E2E_CONCURRENCY; PG* for the database).  It prints one JSON line
// per event on stdout, so that the test knows when it has deliveries in
// flight (to kill it mid-batch) and what it logged:
//   {"event":"ready"}                     start() resolved: it listens
//   {"event":"take","n":3}                idem_take gave it 3 messages
//   {"event":"finish","fn":"idem_retry"}  it began to record an answer
//   {"event":"log","level":"warn","text":"..."}
// SIGTERM stops it gracefully (stop(), then exit 0).
//
// Two faults, for the test that the checker catches a broken dispatcher
// (the package has neither):
//   E2E_REAL_LEASE=ms     idem_take leases for ms, not for the lease the
//                         dispatcher believes in: the dispatcher refuses a
//                         timeout as long as its lease, so this is how its
//                         requests outlive their leases
//   E2E_DROP_FENCING=1    idem_delivered(_many) and idem_retry get the message's
//                         current attempt (read with idem_message) instead
//                         of the attempt its take gave: the fencing token
//                         dropped
'use strict';

const { Pool } = require('pg');
const { createDispatcher } = require('..');

const env = process.env;
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
const pool = new Pool({ max: 12 });

// what idem_take gave, by id: idem_message asks by tenant, topic and key
const taken = new Map();

async function query(text, values) {
  if (/idem_take/.test(text)) {
    const args = env.E2E_REAL_LEASE ? [values[0], values[1], `${env.E2E_REAL_LEASE} milliseconds`, values[3]] : values;
    const result = await pool.query(text, args);
    for (const row of result.rows) taken.set(String(row.id), row);
    if (result.rows.length) emit({ event: 'take', n: result.rows.length });
    return result;
  }
  const fn = (/idem_(delivered|retry|dead)/.exec(text) || [])[0];
  if (!fn) return pool.query(text, values);
  emit({ event: 'finish', fn });
  if (env.E2E_DROP_FENCING === '1' && fn !== 'idem_dead') {
    const current = async (id) => {
      const { tenant, topic, key } = taken.get(String(id));
      const { rows: [now] } = await pool.query('SELECT attempt FROM idem_message($1, $2, $3)', [tenant, topic, key]);
      return now.attempt;
    };
    // idem_delivered_many: every element's attempt is the current one
    if (Array.isArray(values[0])) {
      return pool.query(text, [values[0], await Promise.all(values[0].map(current)), ...values.slice(2)]);
    }
    return pool.query(text, [values[0], await current(values[0]), ...values.slice(2)]);
  }
  return pool.query(text, values);
}

const log = (level) => (text) => emit({ event: 'log', level, text });
const dispatcher = createDispatcher({
  pool: { query, connect: () => pool.connect() },
  topic: env.E2E_TOPIC,
  url: env.E2E_URL,
  lease: Number(env.E2E_LEASE),
  timeout: Number(env.E2E_TIMEOUT),
  pollInterval: Number(env.E2E_POLL),
  concurrency: Number(env.E2E_CONCURRENCY),
  logger: { info: log('info'), warn: log('warn'), error: log('error') },
});

process.on('SIGTERM', async () => {
  await dispatcher.stop();
  await pool.end();
  process.exit(0);
});

dispatcher.start().then(() => emit({ event: 'ready' }));
