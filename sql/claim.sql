--
-- claim.sql: the life of a key, one outcome at a time
--
CREATE EXTENSION idem;
\pset null '(null)'

-- a fresh key is claimed, attempt 1, remembered for idem.retention
SELECT outcome, status, body, attempt,
       expires_at - created_at AS remembered_for
  FROM idem_claim('acme', 'POST /orders', 'k1', '{"qty": 1}'::jsonb);

-- the claim is committed but not finished: in_progress, nothing executes
SELECT outcome, status, body, attempt FROM idem_claim('acme', 'POST /orders', 'k1');
SELECT outcome, attempt FROM idem_replay('acme', 'POST /orders', 'k1');

-- completing stores the response; every later claim replays it byte for byte
SELECT idem_complete('acme', 'POST /orders', 'k1', 201, '\x7b226964223a20317d00ff'::bytea);
SELECT outcome, status, encode(body, 'hex') AS body, attempt
  FROM idem_claim('acme', 'POST /orders', 'k1', '{"qty": 1}'::jsonb);
SELECT outcome, status, body = '\x7b226964223a20317d00ff'::bytea AS same_bytes
  FROM idem_claim('acme', 'POST /orders', 'k1');
SELECT outcome, status, encode(body, 'hex') AS body
  FROM idem_replay('acme', 'POST /orders', 'k1');

-- the same key with other request parameters is refused, and changes nothing
SELECT outcome, status, body, attempt
  FROM idem_claim('acme', 'POST /orders', 'k1', '{"qty": 2}'::jsonb);
SELECT outcome, status FROM idem_replay('acme', 'POST /orders', 'k1');

-- a jsonb fingerprint is canonical: key order and white space do not matter
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k2',
                               '{"a": 1, "b": [1, 2]}'::jsonb);
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k2',
                               '{ "b":[1,2],"a":1 }'::jsonb);
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k2',
                               '{"b": [2, 1], "a": 1}'::jsonb);

-- text and bytea fingerprints hash the same bytes
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k3', 'amount=10');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k3', convert_to('amount=10', 'UTF8'));
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k3', 'amount=11');

-- a claim without a fingerprint is never a mismatch
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k3');

-- the scope is tenant + endpoint + key: each differing part is another record
SELECT outcome, attempt FROM idem_claim('globex', 'POST /orders', 'k1');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /refunds', 'k1');
SELECT count(*) FROM idem_record WHERE key = 'k1';

-- text and jsonb bodies are stored as their bytes
SELECT idem_complete('globex', 'POST /orders', 'k1', 200, 'plain text');
SELECT outcome, convert_from(body, 'UTF8') AS body FROM idem_claim('globex', 'POST /orders', 'k1');
SELECT idem_complete('acme', 'POST /refunds', 'k1', 200, '{"b":2,"a":1}'::jsonb);
SELECT outcome, convert_from(body, 'UTF8') AS body FROM idem_claim('acme', 'POST /refunds', 'k1');

-- a response without a body replays without one, and an empty body as empty
SELECT outcome FROM idem_claim('acme', 'DELETE /orders', 'k1');
SELECT idem_complete('acme', 'DELETE /orders', 'k1', 204, NULL::bytea);
SELECT outcome, status, body FROM idem_claim('acme', 'DELETE /orders', 'k1');
SELECT outcome FROM idem_claim('acme', 'DELETE /orders', 'k2');
SELECT idem_complete('acme', 'DELETE /orders', 'k2', 200, ''::bytea);
SELECT outcome, status, body, octet_length(body) FROM idem_claim('acme', 'DELETE /orders', 'k2');

-- a business failure is stored and replayed like a success
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'card-declined');
SELECT idem_fail('acme', 'POST /orders', 'card-declined', 402, '{"error": "declined"}');
SELECT outcome, status, convert_from(body, 'UTF8') AS body, attempt
  FROM idem_claim('acme', 'POST /orders', 'card-declined');

-- a system error lets the next claim execute again, as attempt 2
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'db-down', 'req');
SELECT idem_fail('acme', 'POST /orders', 'db-down', 503, 'try later', retryable => true);
SELECT count(*) AS replayable FROM idem_replay('acme', 'POST /orders', 'db-down');
SELECT outcome, status, body, attempt FROM idem_claim('acme', 'POST /orders', 'db-down', 'other');
SELECT outcome, status, body, attempt FROM idem_claim('acme', 'POST /orders', 'db-down', 'req');
SELECT idem_complete('acme', 'POST /orders', 'db-down', 200, 'done', attempt => 2);
SELECT outcome, status, convert_from(body, 'UTF8') AS body, attempt
  FROM idem_claim('acme', 'POST /orders', 'db-down');

-- a release drops the pending claim: the next claim executes, attempt + 1
SELECT outcome, attempt FROM idem_claim('acme', 'POST /pay', 'p1');
SELECT idem_release('acme', 'POST /pay', 'p1');
SELECT idem_release('acme', 'POST /pay', 'p1');
SELECT idem_release('acme', 'POST /pay', 'p1', attempt => 1);
SELECT outcome, attempt FROM idem_claim('acme', 'POST /pay', 'p1');

-- fencing: the stale attempt 1 can neither finish nor drop attempt 2
\set VERBOSITY terse
SELECT idem_complete('acme', 'POST /pay', 'p1', 200, 'late', attempt => 1);
SELECT idem_fail('acme', 'POST /pay', 'p1', 500, 'late', attempt => 1);
SELECT idem_release('acme', 'POST /pay', 'p1', attempt => 1);
\set VERBOSITY default
SELECT idem_complete('acme', 'POST /pay', 'p1', 200, 'paid', attempt => 2);
SELECT outcome, convert_from(body, 'UTF8') AS body, attempt FROM idem_claim('acme', 'POST /pay', 'p1');

-- a committed pending claim past its lease is unknown, not in_progress
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'p2', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, status, body, attempt FROM idem_claim('acme', 'POST /pay', 'p2');
SELECT outcome, attempt FROM idem_replay('acme', 'POST /pay', 'p2');
-- reconciliation: the effect happened, so complete the unknown attempt
SELECT idem_complete('acme', 'POST /pay', 'p2', 201, 'charged', attempt => 1);
SELECT outcome, status FROM idem_claim('acme', 'POST /pay', 'p2');
-- or it did not: release it and claim again
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'p3', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'p3');
SELECT idem_release('acme', 'POST /pay', 'p3', attempt => 1);
SELECT outcome, attempt FROM idem_claim('acme', 'POST /pay', 'p3');

-- idem.lease is the default lease
SET idem.lease = '10ms';
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'p4');
SELECT pg_sleep(0.05);
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'p4');
RESET idem.lease;

-- a claim that rolls back leaves nothing behind: the key is claimable again
BEGIN;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'rolled-back');
SELECT count(*) FROM idem_record WHERE key = 'rolled-back';
ROLLBACK;
SELECT count(*) FROM idem_record WHERE key = 'rolled-back';
SELECT count(*) FROM idem_replay('acme', 'POST /orders', 'rolled-back');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /orders', 'rolled-back');

-- the application transaction: claim, business write, complete, commit
CREATE TABLE orders (id serial PRIMARY KEY, idem_key text UNIQUE, qty int);
BEGIN;
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'order-1', '{"qty": 3}'::jsonb);
INSERT INTO orders (idem_key, qty) VALUES ('order-1', 3);
SELECT idem_complete('acme', 'POST /v1/orders', 'order-1', 201,
                     jsonb_build_object('id', currval('orders_id_seq')));
COMMIT;
-- the retry replays and writes nothing
SELECT outcome, status, convert_from(body, 'UTF8') AS body
  FROM idem_claim('acme', 'POST /v1/orders', 'order-1', '{"qty":3}'::jsonb);
SELECT count(*) FROM orders;

-- a claim in the same transaction as its own pending claim: in_progress
BEGIN;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'twice');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'twice');
COMMIT;

-- records past their retention (and lease) are forgotten: replay shows
-- nothing, a claim starts over, fenced above the old attempt, and
-- idem_purge deletes them
SET idem.retry_window = '1s';
SET idem.retention = '2s';
SELECT outcome FROM idem_claim('acme', 'POST /short', 's1', lease => '1s');
SELECT idem_complete('acme', 'POST /short', 's1', 200, 'short');
SELECT outcome FROM idem_claim('acme', 'POST /short', 's2', lease => '1s');
SELECT idem_fail('acme', 'POST /short', 's2', 503, 'x', retryable => true);
SELECT outcome FROM idem_claim('acme', 'POST /short', 's2', lease => '1s');
SELECT pg_sleep(2.1);
SELECT count(*) FROM idem_replay('acme', 'POST /short', 's1');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /short', 's2', 'changed');
SELECT idem_purge();
SELECT key FROM idem_record WHERE endpoint = 'POST /short' ORDER BY key;
SELECT idem_purge();
RESET idem.retention;
RESET idem.retry_window;
DROP TABLE orders;
DROP EXTENSION idem;
