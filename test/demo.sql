-- test/demo.sql: what "make run" shows: the four answers a claim gives
\pset null '(null)'
\set ECHO queries
CREATE EXTENSION idem;
CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL);

\echo
\echo '== 1. a first request: claimed, so execute it and complete it in the same transaction'
BEGIN;
SELECT outcome, attempt FROM idem_claim('acme', 'POST /v1/orders', 'key-123', '{"item": "book"}'::jsonb);
INSERT INTO orders (item) VALUES ('book') RETURNING id;
SELECT idem_complete('acme', 'POST /v1/orders', 'key-123', 201, '{"id": 1, "item": "book"}'::jsonb);
COMMIT;

\echo
\echo '== 2. the client timed out and retries with the same key: replay, byte for byte, nothing executes'
SELECT outcome, status, convert_from(body, 'UTF8') AS body
  FROM idem_claim('acme', 'POST /v1/orders', 'key-123', '{ "item":"book" }'::jsonb);
SELECT count(*) AS orders FROM orders;

\echo
\echo '== 3. the same key with a different request: mismatch (HTTP 422), nothing executes'
SELECT outcome, status, body
  FROM idem_claim('acme', 'POST /v1/orders', 'key-123', '{"item": "lamp"}'::jsonb);

\echo
\echo '== 4. a claim committed before an external call, still running: in_progress (HTTP 409)'
SELECT outcome FROM idem_claim('acme', 'POST /v1/payments', 'pay-7', lease => '5 min');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /v1/payments', 'pay-7');
SELECT idem_complete('acme', 'POST /v1/payments', 'pay-7', 201, 'charged', attempt => 1);
SELECT outcome, status, convert_from(body, 'UTF8') AS body
  FROM idem_claim('acme', 'POST /v1/payments', 'pay-7');

\echo
\echo '== the records'
SELECT tenant, endpoint, key, state, status, attempt FROM idem_record ORDER BY endpoint;
