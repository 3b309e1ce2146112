--
-- stats.sql: the idem_stats counters and outcome logging
--
CREATE EXTENSION idem;
SELECT idem_stats_reset();

-- one claim of each outcome
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a', 'req');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a', 'req');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a', 'other');
SELECT idem_complete('acme', 'POST /orders', 'a', 201, 'ok');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a', 'req');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'b', lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'b');
-- and each way to finish a claim
SELECT idem_fail('acme', 'POST /orders', 'b', 500, 'boom', retryable => true);
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'b');
SELECT idem_release('acme', 'POST /orders', 'b');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'b');
SELECT idem_fail('acme', 'POST /orders', 'b', 409, 'no');
-- errors count nothing
SELECT idem_complete('acme', 'POST /orders', 'b', 200, 'again');

SELECT claims_claimed, claims_replay, claims_in_progress, claims_mismatch,
       claims_unknown, completes, fails, fails_retryable, releases
  FROM idem_stats WHERE datname = current_database();

-- purges count their rows and when they ran
SET idem.retry_window = '1s';
SET idem.retention = '2s';
SELECT outcome FROM idem_claim('acme', 'POST /short', 'x', lease => '1s');
SELECT outcome FROM idem_claim('acme', 'POST /short', 'y', lease => '1s');
SELECT pg_sleep(2.1);
SELECT idem_purge();
RESET idem.retention;
RESET idem.retry_window;
SELECT purged, last_purge IS NOT NULL AS purged_at, last_purge_ms >= 0 AS took,
       stats_reset <= last_purge AS after_reset
  FROM idem_stats WHERE datname = current_database();

-- a reset zeroes every counter
SELECT idem_stats_reset();
SELECT claims_claimed + claims_replay + completes + purged AS total,
       last_purge IS NULL AS no_purge_since
  FROM idem_stats WHERE datname = current_database();

-- pg_monitor may read the counters; PUBLIC may neither read nor reset them
CREATE ROLE idem_watcher IN ROLE pg_monitor;
CREATE ROLE idem_app;
SET ROLE idem_watcher;
SELECT count(*) FROM idem_stats WHERE datname = current_database();
SET ROLE idem_app;
SELECT count(*) FROM idem_stats;
SELECT idem_stats_reset();
RESET ROLE;
DROP ROLE idem_watcher;
DROP ROLE idem_app;

-- idem.log_outcomes logs one greppable line per decision, with the
-- transaction's idem.trace, its values escaped
SET idem.log_outcomes = on;
SET client_min_messages = log;
BEGIN;
SET LOCAL idem.trace = 't-1';
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'logged');
COMMIT;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'logged');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a');
SET idem.trace = 'evil" outcome=replay
LOG:  x';
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a"b\');
RESET idem.trace;
-- the outbox's decisions
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'y'::bytea);
SELECT key, attempt FROM idem_take('mail');
SELECT idem_delivered(id, 1) FROM idem_outbox WHERE key = 'm1';
-- conflicts: only in_progress, mismatch and unknown
SET idem.log_outcomes = conflicts;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'quiet');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'quiet');
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'z'::bytea);
-- 0.3.0's boolean spellings
SET idem.log_outcomes = true;
SHOW idem.log_outcomes;
SET idem.log_outcomes = 'loud';
RESET client_min_messages;
RESET idem.log_outcomes;
-- idem.trace is any role's, at most 255 bytes
SET idem.trace = 'ok';
SELECT set_config('idem.trace', repeat('t', 256), true);
RESET idem.trace;

-- every element of a batch counts as its single call would
SELECT idem_stats_reset();
SELECT count(*) FROM idem_claim_many('acme', 'POST /stats', ARRAY['s1', 's2', 's1']);
SELECT idem_complete_many('acme', 'POST /stats', ARRAY['s1', 's2'], ARRAY[200, 200], NULL);
SELECT claims_claimed, claims_in_progress, completes
  FROM idem_stats WHERE datname = current_database();

-- a claim that a freeze stops counts as frozen
SELECT idem_freeze('acme', 'POST /frozen', 'counted');
SELECT outcome FROM idem_claim('acme', 'POST /frozen', 'f1');
SELECT claims_frozen AS frozen FROM idem_stats WHERE datname = current_database();
SELECT idem_thaw('acme', 'POST /frozen');

DROP EXTENSION idem;
