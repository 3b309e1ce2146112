--
-- trace.sql: idem.trace stored (0.4.0).  The claim that executes stores
-- the transaction's idem.trace on the record (column trace), a finish
-- keeps it, a re-claim that executes again stores its own; a replay or
-- any other answer writes nothing.  An enqueue stores it on the message.
-- idem_list and idem_message show it.
--
CREATE EXTENSION idem;
BEGIN;
SET LOCAL idem.trace = '4bf92f3577b34da6a3ce929d0e0e4736';
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'k1');
SELECT idem_complete('acme', 'POST /v1/orders', 'k1', 201, 'created');
COMMIT;
-- a retry under another trace replays, and changes nothing
BEGIN;
SET LOCAL idem.trace = 'retry-trace';
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'k1');
COMMIT;
-- no trace: NULL
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'k2');
SELECT idem_fail('acme', 'POST /v1/orders', 'k2', 503, 'down', retryable => true);
SELECT key, state, attempt, trace FROM idem_list('acme') ORDER BY key;
-- the attempt that executes again stores its own trace; its finish keeps it
BEGIN;
SET LOCAL idem.trace = 't-2';
SELECT outcome, attempt FROM idem_claim('acme', 'POST /v1/orders', 'k2');
COMMIT;
SELECT idem_complete('acme', 'POST /v1/orders', 'k2', 200, 'ok');
-- a batch stores it on every key it claims
BEGIN;
SET LOCAL idem.trace = 't-batch';
SELECT key, outcome FROM idem_claim_many('acme', 'POST /v1/orders', ARRAY['k1', 'k3', 'k4']);
COMMIT;
SELECT key, state, attempt, trace FROM idem_list('acme') ORDER BY key;
SHOW idem.trace;

-- the outbox
BEGIN;
SET LOCAL idem.trace = 't-out';
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
SELECT outcome FROM idem_enqueue_many('acme', 'mail', ARRAY['m2', 'm3'], ARRAY['y', 'z']::bytea[]);
COMMIT;
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm4', 'x'::bytea);
SELECT key, trace FROM idem_outbox ORDER BY key;
SELECT state, trace FROM idem_message('acme', 'mail', 'm1');
SELECT state, trace FROM idem_message('acme', 'mail', 'm4');

DROP EXTENSION idem;
