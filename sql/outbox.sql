-- The outbox: idem_enqueue, idem_take, idem_delivered, idem_retry,
-- idem_dead, idem_requeue, idem_message, the stats view, the settings,
-- the notification and bad input.  Races are in the isolation specs
-- (test/isolation/specs/outbox-*.spec).
CREATE EXTENSION idem;
\set VERBOSITY default

-- enqueued, duplicate (same payload: nothing changes), mismatch (another
-- payload: nothing changes); the same id comes back
SELECT outcome, id > 0 AS has_id, state FROM idem_enqueue('acme', 'mail', 'k1', 'hello'::bytea);
SELECT outcome, state FROM idem_enqueue('acme', 'mail', 'k1', 'hello'::bytea);
SELECT outcome, state FROM idem_enqueue('acme', 'mail', 'k1', 'hello'::text);
SELECT outcome, state FROM idem_enqueue('acme', 'mail', 'k1', 'other'::text);
SELECT count(*), min(convert_from(payload, 'UTF8')) FROM idem_outbox WHERE key = 'k1';
SELECT (SELECT id FROM idem_enqueue('acme', 'mail', 'k1', 'x'::bytea))
     = (SELECT id FROM idem_outbox WHERE key = 'k1') AS same_id;
-- the scope is tenant + topic + key
SELECT outcome FROM idem_enqueue('other', 'mail', 'k1', 'hello'::bytea);
SELECT outcome FROM idem_enqueue('acme', 'sms', 'k1', 'hello'::bytea);
-- jsonb payloads are canonical: key order and white space do not matter
SELECT outcome FROM idem_enqueue('acme', 'mail', 'j1', '{"b": 1, "a": [1, 2]}'::jsonb);
SELECT outcome FROM idem_enqueue('acme', 'mail', 'j1', '{ "a":[1,2],"b":1 }'::jsonb);
SELECT outcome FROM idem_enqueue('acme', 'mail', 'j1', '{"a": [2, 1], "b": 1}'::jsonb);
SELECT convert_from(payload, 'UTF8') FROM idem_outbox WHERE key = 'j1';

-- a rollback leaves nothing
BEGIN;
SELECT outcome FROM idem_enqueue('acme', 'mail', 'rolled-back', 'x'::bytea);
ROLLBACK;
SELECT count(*) FROM idem_outbox WHERE key = 'rolled-back';
SELECT * FROM idem_message('acme', 'mail', 'rolled-back');
-- in a savepoint too
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_enqueue('acme', 'mail', 'sp', 'x'::bytea);
ROLLBACK TO s;
SELECT outcome FROM idem_enqueue('acme', 'mail', 'sp', 'y'::bytea);
COMMIT;
SELECT convert_from(payload, 'UTF8') FROM idem_outbox WHERE key = 'sp';

-- the message's own row: queued, attempt 0, due now, headers kept
SELECT outcome FROM idem_enqueue('acme', 'hooks', 'h1', 'body'::bytea,
	headers => '{"Content-Type": "application/json", "X-Tag": ["a", "b"]}');
SELECT state, attempt, headers, redeliver, max_attempts, ordering_key IS NULL AS no_ordering_key,
	   not_before = created_at AS due_now, finished_at IS NULL AS unfinished, expires_at - created_at AS retention
  FROM idem_outbox WHERE key = 'h1';

-- take: leases due messages, oldest due first, attempt 1, the lease's end;
-- committed before the dispatcher calls out
SELECT id AS h1 FROM idem_outbox WHERE key = 'h1' \gset
SELECT tenant, topic, key, convert_from(payload, 'UTF8') AS payload, headers, attempt,
	   lease_expires_at > now() + interval '29 s' AND lease_expires_at < clock_timestamp() + interval '31 s' AS lease_30s
  FROM idem_take('hooks', 10, lease => '30 s');
SELECT state, attempt, not_before = lease_expires_at AS due_at_lease_end FROM idem_outbox WHERE id = :h1;
-- a leased message is not taken again while its lease runs
SELECT count(*) FROM idem_take('hooks', 10);
SELECT state, attempt FROM idem_message('acme', 'hooks', 'h1');

-- delivered: stores the receiver's answer; the attempt must be the live lease
SELECT idem_delivered(:h1, 2, 200, 'ok');
SELECT idem_delivered(:h1, 1, 201, 'created');
SELECT state, attempt, status, convert_from(body, 'UTF8') AS body, last_error,
	   finished_at IS NOT NULL AS finished,
	   expires_at - finished_at AS kept
  FROM idem_message('acme', 'hooks', 'h1');
-- a second answer for the same attempt is stale too
SELECT idem_delivered(:h1, 1, 200, 'again');
SELECT idem_retry(:h1, 1);
SELECT idem_dead(:h1, 1);
-- an id that does not exist
SELECT idem_delivered(-1, 1);
SELECT idem_retry(-1, 1);

-- not_before: not due before it
SELECT outcome FROM idem_enqueue('acme', 'later', 'l1', 'x'::bytea, not_before => now() + interval '1 hour');
SELECT count(*) FROM idem_take('later');
SELECT outcome FROM idem_enqueue('acme', 'later', 'l0', 'x'::bytea, not_before => now() - interval '1 hour');
SELECT key FROM idem_take('later', 10);

-- oldest due first, max_messages at most
SELECT outcome FROM idem_enqueue('acme', 'order', 'b', 'x'::bytea, not_before => now() - interval '2 min');
SELECT outcome FROM idem_enqueue('acme', 'order', 'a', 'x'::bytea, not_before => now() - interval '3 min');
SELECT outcome FROM idem_enqueue('acme', 'order', 'c', 'x'::bytea, not_before => now() - interval '1 min');
SELECT key FROM idem_take('order', 2);
SELECT key FROM idem_take('order', 2);

-- retry: queued again after the backoff (1s, then doubled, jittered),
-- dead once max_attempts attempts failed; returns the new state
SET idem.outbox_backoff = '10 s';
SELECT id AS r1 FROM idem_enqueue('acme', 'retry', 'r1', 'x'::bytea, max_attempts => 3) \gset
SELECT attempt FROM idem_take('retry');
SELECT idem_retry(:r1, 1, 'HTTP 503');
SELECT state, attempt, last_error,
	   not_before BETWEEN clock_timestamp() + interval '4 s' AND clock_timestamp() + interval '10 s' AS backoff_5_to_10s
  FROM idem_message('acme', 'retry', 'r1');
SELECT count(*) FROM idem_take('retry');
-- after => given: due then (here at once)
UPDATE idem_outbox SET not_before = now() WHERE id = :r1;
SELECT attempt FROM idem_take('retry');
SELECT idem_retry(:r1, 2, 'HTTP 429', after => '0 s');
SELECT not_before <= clock_timestamp() AS due FROM idem_message('acme', 'retry', 'r1');
SELECT attempt FROM idem_take('retry');
-- the third failed attempt of three: dead
SELECT idem_retry(:r1, 3, 'HTTP 500');
SELECT state, attempt, last_error, finished_at IS NOT NULL AS finished FROM idem_message('acme', 'retry', 'r1');
SELECT count(*) FROM idem_take('retry');
RESET idem.outbox_backoff;
-- the second failure waits twice as long as the first (before jitter)
SET idem.outbox_backoff = '1 min';
SELECT id AS r2 FROM idem_enqueue('acme', 'retry', 'r2', 'x'::bytea) \gset
SELECT attempt FROM idem_take('retry');
SELECT idem_retry(:r2, 1);
UPDATE idem_outbox SET not_before = now() WHERE id = :r2;
SELECT attempt FROM idem_take('retry');
SELECT idem_retry(:r2, 2);
SELECT not_before BETWEEN clock_timestamp() + interval '59 s' AND clock_timestamp() + interval '2 min' AS backoff_1_to_2min
  FROM idem_message('acme', 'retry', 'r2');
-- capped by idem.outbox_backoff_max
SET idem.outbox_backoff_max = '1 min';
UPDATE idem_outbox SET not_before = now() WHERE id = :r2;
SELECT attempt FROM idem_take('retry');
SELECT idem_retry(:r2, 3);
SELECT not_before BETWEEN clock_timestamp() + interval '29 s' AND clock_timestamp() + interval '1 min' AS backoff_capped
  FROM idem_message('acme', 'retry', 'r2');
RESET idem.outbox_backoff;
RESET idem.outbox_backoff_max;

-- dead at once (a permanent failure)
SELECT id AS d1 FROM idem_enqueue('acme', 'dead', 'd1', 'x'::bytea) \gset
SELECT attempt FROM idem_take('dead');
SELECT idem_dead(:d1, 1, 'HTTP 404');
SELECT state, attempt, last_error FROM idem_message('acme', 'dead', 'd1');
-- requeue: dead or unknown -> queued, due now, a new run of attempts;
-- the attempts go on counting
SELECT idem_requeue(:d1);
SELECT state, attempt, finished_at IS NULL AS unfinished FROM idem_message('acme', 'dead', 'd1');
SELECT attempt FROM idem_take('dead');
SELECT idem_dead(:d1, 1);
-- only dead or unknown messages: this one is leased
SELECT idem_requeue(:d1);
SELECT idem_dead(:d1, 2);
SELECT state, attempt FROM idem_message('acme', 'dead', 'd1');
SELECT idem_requeue(-1);
-- not executable by PUBLIC
SELECT has_function_privilege('public', 'idem_requeue(bigint)', 'EXECUTE') AS public_may_requeue;

-- a lease that runs out: due again, the next take gives attempt + 1, and
-- the stale attempt cannot finish it
SELECT id AS e1 FROM idem_enqueue('acme', 'expiry', 'e1', 'x'::bytea) \gset
SELECT attempt FROM idem_take('expiry', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state FROM idem_message('acme', 'expiry', 'e1');
-- a lease that ran out is not live, even before another take
SELECT idem_delivered(:e1, 1, 200);
SELECT idem_retry(:e1, 1);
SELECT attempt FROM idem_take('expiry');
SELECT idem_delivered(:e1, 1, 200);
SELECT idem_delivered(:e1, 2, 200);
SELECT state, attempt, status FROM idem_message('acme', 'expiry', 'e1');
-- a lease that runs out max_attempts times: dead
SELECT id AS e2 FROM idem_enqueue('acme', 'expiry', 'e2', 'x'::bytea, max_attempts => 1) \gset
SELECT attempt FROM idem_take('expiry', lease => '10 ms');
SELECT pg_sleep(0.05);
-- shown as the next take will leave it
SELECT state FROM idem_message('acme', 'expiry', 'e2');
SELECT topic, queued, dead FROM idem_outbox_stats WHERE topic = 'expiry';
SELECT count(*) FROM idem_take('expiry');
SELECT state, attempt, last_error FROM idem_message('acme', 'expiry', 'e2');

-- redeliver => false: a lease that runs out makes the message unknown,
-- never taken again until an operator decides
SELECT id AS u1 FROM idem_enqueue('acme', 'charge', 'u1', 'x'::bytea, redeliver => false) \gset
SELECT attempt FROM idem_take('charge', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state, attempt FROM idem_message('acme', 'charge', 'u1');
SELECT count(*) FROM idem_take('charge');
SELECT state FROM idem_outbox WHERE id = :u1;
SELECT count(*) FROM idem_take('charge');
-- the operator checked the receiver: it was delivered
SELECT idem_retry(:u1, 1);
SELECT idem_delivered(:u1, 1, 200, 'found');
SELECT state, attempt, status FROM idem_message('acme', 'charge', 'u1');
-- or requeues it
SELECT id AS u2 FROM idem_enqueue('acme', 'charge', 'u2', 'x'::bytea, redeliver => false) \gset
SELECT attempt FROM idem_take('charge', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT idem_requeue(:u2);
SELECT attempt FROM idem_take('charge');

-- ordering keys: a message is due only when every earlier one of its
-- (tenant, topic, ordering key) is delivered or dead
SELECT outcome FROM idem_enqueue('acme', 'seq', 's1', 'x'::bytea, ordering_key => 'order-7');
SELECT outcome FROM idem_enqueue('acme', 'seq', 's2', 'x'::bytea, ordering_key => 'order-7');
SELECT outcome FROM idem_enqueue('acme', 'seq', 's3', 'x'::bytea, ordering_key => 'order-8');
SELECT outcome FROM idem_enqueue('other', 'seq', 's4', 'x'::bytea, ordering_key => 'order-7');
SELECT outcome FROM idem_enqueue('acme', 'seq', 's5', 'x'::bytea);
SELECT tenant, key, attempt FROM idem_take('seq', 10) ORDER BY key;
SELECT count(*) FROM idem_take('seq', 10);
SELECT idem_retry(id, 1, after => '0 s') FROM idem_outbox WHERE key = 's1';
-- s1 is queued again: s2 still waits
SELECT key, attempt FROM idem_take('seq', 10);
SELECT idem_delivered(id, 2) FROM idem_outbox WHERE key = 's1';
SELECT key, attempt FROM idem_take('seq', 10);
-- a dead head lets the next one go too
SELECT outcome FROM idem_enqueue('acme', 'seq', 's6', 'x'::bytea, ordering_key => 'order-9');
SELECT outcome FROM idem_enqueue('acme', 'seq', 's7', 'x'::bytea, ordering_key => 'order-9');
SELECT key FROM idem_take('seq', 10);
SELECT idem_dead(id, 1) FROM idem_outbox WHERE key = 's6';
SELECT key FROM idem_take('seq', 10);

-- the tenant argument of a take
SELECT outcome FROM idem_enqueue('acme', 'multi', 'm1', 'x'::bytea);
SELECT outcome FROM idem_enqueue('globex', 'multi', 'm2', 'x'::bytea);
SELECT tenant, key FROM idem_take('multi', 10, tenant => 'globex');
SELECT tenant, key FROM idem_take('multi', 10);

-- the stats view
SELECT topic, queued, leased, unknown, delivered, dead, deliveries, retries, deaths,
	   oldest_due_age IS NOT NULL AS has_due
  FROM idem_outbox_stats WHERE topic IN ('retry', 'seq', 'charge', 'later') ORDER BY topic;
SELECT has_table_privilege('public', 'idem_outbox_stats', 'SELECT') AS public_reads,
	   has_table_privilege('pg_monitor', 'idem_outbox_stats', 'SELECT') AS pg_monitor_reads;

-- purge: delivered and dead messages idem.outbox_retention after they
-- finished; queued, leased and unknown ones never
SELECT count(*) AS finished FROM idem_outbox WHERE state IN ('delivered', 'dead') \gset
UPDATE idem_outbox SET expires_at = now() - interval '1 s', finished_at = now() - interval '8 days'
 WHERE state IN ('delivered', 'dead');
UPDATE idem_outbox SET created_at = now() - interval '30 days' WHERE state NOT IN ('delivered', 'dead');
SELECT idem_purge() = :finished AS purged_the_finished;
SELECT count(*) FROM idem_outbox WHERE state IN ('delivered', 'dead');
SELECT count(*) > 0 AS others_kept FROM idem_outbox;
-- a purged key can be enqueued again, as a new message
SELECT outcome FROM idem_enqueue('acme', 'hooks', 'h1', 'body'::bytea);
SET idem.outbox_retention = '2h';
SELECT id AS p1 FROM idem_enqueue('acme', 'purge', 'p1', 'x'::bytea) \gset
SELECT attempt FROM idem_take('purge');
SELECT idem_delivered(:p1, 1);
SELECT expires_at - finished_at AS kept FROM idem_message('acme', 'purge', 'p1');
RESET idem.outbox_retention;

-- caps: idem.max_lease binds a take's lease, idem.max_retention the
-- outbox's retention
SET idem.max_lease = '1 min';
SELECT count(*) FROM idem_take('purge', lease => '2 min');
SET idem.max_retention = '1d';
SELECT outcome FROM idem_enqueue('acme', 'caps', 'c1', 'x'::bytea);
SET idem.outbox_retention = '2h';
SELECT id AS c1 FROM idem_enqueue('acme', 'caps', 'c1', 'x'::bytea) \gset
SELECT attempt FROM idem_take('caps', lease => '30 s');
-- the enqueue fixes the retention: a finisher's own settings change nothing
-- (a shorter retention would let the business transaction's retry send the
-- message again), and only a finished message shows its expiry
SELECT expires_at IS NULL AS unfinished FROM idem_message('acme', 'caps', 'c1');
SET idem.retry_window = '1s';
SET idem.outbox_retention = '2s';
SELECT idem_delivered(:c1, 1);
SELECT expires_at - finished_at AS kept FROM idem_message('acme', 'caps', 'c1');
RESET idem.retry_window;
-- a dead message queued again keeps its enqueue's retention
SET idem.outbox_retention = '2h';
SELECT id AS c3 FROM idem_enqueue('acme', 'caps', 'c3', 'x'::bytea) \gset
SELECT attempt FROM idem_take('caps', lease => '30 s');
SELECT idem_dead(:c3, 1);
SET idem.outbox_retention = '3h';
SELECT idem_requeue(:c3);
SELECT attempt FROM idem_take('caps', lease => '30 s');
SELECT idem_delivered(:c3, 2);
SELECT expires_at - finished_at AS kept FROM idem_message('acme', 'caps', 'c3');
-- the retention must outlive the callers' retry window
SET idem.outbox_retention = '1h';
SELECT outcome FROM idem_enqueue('acme', 'caps', 'c2', 'x'::bytea);
RESET idem.max_lease;
RESET idem.max_retention;
RESET idem.outbox_retention;

-- bad input
SELECT idem_enqueue(NULL, 'mail', 'k', 'x'::bytea);
SELECT idem_enqueue('acme', '', 'k', 'x'::bytea);
SELECT idem_enqueue('acme', 'mail', repeat('k', 256), 'x'::bytea);
SELECT idem_enqueue('acme', 'mail', 'k', NULL::bytea);
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, headers => '[1]');
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, headers => '{"Bad Name": "x"}');
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, max_attempts => 0);
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, ordering_key => '');
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, not_before => 'infinity');
SELECT idem_enqueue('acme', 'mail', 'k', 'x'::bytea, redeliver => NULL);
SET idem.max_body_size = '1kB';
SELECT idem_enqueue('acme', 'mail', 'k', repeat('x', 2000)::bytea);
SELECT idem_delivered(:p1, 1, 200, repeat('x', 2000)::bytea);
RESET idem.max_body_size;
SELECT idem_take(NULL);
SELECT idem_take('mail', 0);
SELECT idem_take('mail', 10001);
SELECT idem_take('mail', NULL);
SELECT idem_take('mail', 1, lease => '0 s');
SELECT idem_take('mail', 1, lease => '-1 s');
SELECT idem_take('mail', 1, tenant => '');
SELECT idem_delivered(NULL, 1);
SELECT idem_delivered(1, NULL);
SELECT idem_delivered(1, 0);
SELECT idem_delivered(:p1, 1, 700);
SELECT idem_retry(:p1, 1, after => '-1 s');
SET idem.max_body_size = '1kB';
SELECT idem_retry(:p1, 1, error => repeat('e', 2000));
RESET idem.max_body_size;
SELECT idem_message('acme', NULL, 'k');
SELECT count(*) FROM idem_outbox WHERE key = 'k';
-- the errors leave the transaction as core's do
BEGIN;
SELECT idem_take('mail', 0);
SELECT 1;
ROLLBACK;

-- the table is the extension's: PUBLIC may not read or write it
SELECT has_table_privilege('public', 'idem_outbox', 'SELECT') AS public_reads,
	   has_table_privilege('public', 'idem_outbox', 'INSERT') AS public_writes;
-- a take leaves what its own transaction enqueued: that may roll back
BEGIN;
SELECT outcome FROM idem_enqueue('acme', 'own', 'o1', 'x'::bytea);
SELECT count(*) FROM idem_take('own');
COMMIT;
SELECT key FROM idem_take('own');

-- the stats view is for pg_monitor, without the payloads; idem_purge()
-- granted to an operator purges the outbox too
CREATE ROLE outbox_monitor IN ROLE pg_monitor;
CREATE ROLE outbox_operator;
GRANT EXECUTE ON FUNCTION idem_purge() TO outbox_operator;
SET ROLE outbox_monitor;
SELECT topic, leased FROM idem_outbox_stats WHERE topic = 'own';
SELECT count(*) FROM idem_outbox;
SET ROLE outbox_operator;
SELECT idem_purge() >= 0 AS purged;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_purge() FROM outbox_operator;
DROP ROLE outbox_monitor;
DROP ROLE outbox_operator;

-- the tenant binding: a bound role enqueues, takes and reads its own
-- tenant's messages only
TRUNCATE idem_outbox;
CREATE ROLE outbox_acme LOGIN;
CREATE ROLE outbox_free LOGIN;
SELECT idem_bind('outbox_acme', 'acme');
SELECT outcome FROM idem_enqueue('acme', 'bound', 'a1', 'x'::bytea);
SELECT outcome FROM idem_enqueue('globex', 'bound', 'g1', 'x'::bytea);
SELECT id AS g1 FROM idem_outbox WHERE key = 'g1' \gset
GRANT SELECT ON idem_outbox TO outbox_acme;
GRANT SELECT ON idem_outbox_stats TO outbox_acme;
SET ROLE outbox_acme;
SELECT outcome FROM idem_enqueue('acme', 'bound', 'a2', 'x'::bytea);
SELECT outcome FROM idem_enqueue('globex', 'bound', 'g2', 'x'::bytea);
SELECT * FROM idem_message('globex', 'bound', 'g1');
SELECT count(*) FROM idem_take('bound', 10, tenant => 'globex');
-- no tenant named: its own tenant's messages only
SELECT tenant, key, attempt FROM idem_take('bound', 10) ORDER BY key;
-- another tenant's message by id
SELECT idem_delivered(:g1, 1);
SELECT idem_dead(:g1, 1);
-- reading the table: row-level security shows its own tenant only, and
-- the stats view too
SELECT tenant, key FROM idem_outbox ORDER BY key;
SELECT topic, queued, leased FROM idem_outbox_stats WHERE topic = 'bound';
-- and it cannot write the table
UPDATE idem_outbox SET state = 'dead';
RESET ROLE;
SELECT key, state FROM idem_outbox ORDER BY key;
-- the binding is the caller's, checked before the finish switches to the
-- table's owner: a security definer function of a bound role finishes no
-- other tenant's message, whoever calls it
GRANT EXECUTE ON FUNCTION idem_requeue(bigint) TO outbox_acme;
CREATE FUNCTION public.finish_as_acme(how text, id bigint) RETURNS text
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
	CASE how
	WHEN 'delivered' THEN PERFORM idem_delivered(id, 1);
	WHEN 'retry' THEN PERFORM idem_retry(id, 1);
	WHEN 'dead' THEN PERFORM idem_dead(id, 1);
	WHEN 'requeue' THEN PERFORM idem_requeue(id);
	END CASE;
	RETURN how;
END $$;
ALTER FUNCTION public.finish_as_acme(text, bigint) OWNER TO outbox_acme;
SELECT public.finish_as_acme('delivered', :g1);
SELECT public.finish_as_acme('retry', :g1);
SELECT public.finish_as_acme('dead', :g1);
SELECT public.finish_as_acme('requeue', :g1);
DROP FUNCTION public.finish_as_acme(text, bigint);
REVOKE EXECUTE ON FUNCTION idem_requeue(bigint) FROM outbox_acme;
-- and under idem.require_binding an unbound role finishes nothing
GRANT EXECUTE ON FUNCTION idem_requeue(bigint) TO outbox_free;
SET idem.require_binding = on;
SET ROLE outbox_free;
SELECT idem_delivered(:g1, 1);
SELECT idem_retry(:g1, 1);
SELECT idem_dead(:g1, 1);
SELECT idem_requeue(:g1);
RESET ROLE;
RESET idem.require_binding;
-- an unbound role takes every tenant's messages
SET ROLE outbox_free;
SELECT tenant, key, attempt FROM idem_take('bound', 10) ORDER BY key;
SELECT idem_dead(:g1, 1);
SELECT idem_requeue(:g1);
RESET ROLE;
REVOKE SELECT ON idem_outbox FROM outbox_acme;
REVOKE SELECT ON idem_outbox_stats FROM outbox_acme;
REVOKE EXECUTE ON FUNCTION idem_requeue(bigint) FROM outbox_free;
SELECT idem_unbind('outbox_acme');
DROP ROLE outbox_acme;
DROP ROLE outbox_free;

DROP EXTENSION idem;
