--
-- outbox_batch.sql: batches of the outbox (0.4.0).  idem_enqueue_many
-- answers each element as idem_enqueue would; idem_delivered_many finishes
-- a take's leases in one call, and a stale attempt anywhere errors and
-- writes nothing of the batch; empty or NULL arrays finish nothing.
--
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT key, outcome, state FROM idem_enqueue_many('acme', 'mail',
	ARRAY['m1', 'm2', 'm3'], ARRAY['one', 'two', 'three']::bytea[],
	ARRAY['{"X-Tag": "a"}', NULL, NULL]::jsonb[]);
-- a repeat, and the same key twice in one call: duplicate; another payload: mismatch
SELECT key, outcome FROM idem_enqueue_many('acme', 'mail',
	ARRAY['m1', 'm4', 'm4', 'm2'], ARRAY['one', 'four', 'four', 'other']::bytea[]);
SELECT key, outcome FROM idem_enqueue_many('acme', 'json', ARRAY['j1', 'j1'],
	ARRAY['{"b": 1, "a": 2}', '{"a": 2, "b": 1}']::jsonb[]);
SELECT key, convert_from(payload, 'UTF8') AS payload, headers FROM idem_outbox ORDER BY key;
-- under REPEATABLE READ too: the repeat is this transaction's own message
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT key, outcome FROM idem_enqueue_many('acme', 'rr', ARRAY['r1', 'r1'],
	ARRAY['x', 'x']::bytea[]);
ROLLBACK;
-- arrays whose subscripts start elsewhere than 1, element by element
SELECT key, outcome FROM idem_enqueue_many('acme', 'bounds', '[0:1]={b1,b2}'::text[],
	'[2:3]={x,y}'::bytea[], '[-1:0]={NULL,"{}"}'::jsonb[]);
SELECT key, convert_from(payload, 'UTF8') AS payload, headers FROM idem_outbox
 WHERE topic = 'bounds' ORDER BY key;
-- nothing to enqueue
SELECT count(*) FROM idem_enqueue_many('acme', 'mail', ARRAY[]::text[], ARRAY[]::bytea[]);

-- a take's leases finished in one call, with the receivers' statuses
SELECT array_agg(id ORDER BY key) AS ids, array_agg(attempt ORDER BY key) AS attempts
  FROM idem_take('mail', 10) \gset
SELECT idem_delivered_many(:'ids', :'attempts', ARRAY[200, NULL, 202, 201],
	ARRAY['ok', NULL, NULL, '']::bytea[]);
SELECT key, state, status, body FROM idem_outbox WHERE topic = 'mail' ORDER BY key;
SELECT id AS b1, attempt AS b1a FROM idem_take('bounds', 1) \gset
SELECT idem_delivered_many(('[0:0]={' || :b1 || '}')::bigint[],
	('[4:4]={' || :b1a || '}')::integer[], '[9:9]={203}'::integer[]);
SELECT key, state, status FROM idem_outbox WHERE topic = 'bounds' ORDER BY key;
-- a stale attempt anywhere: 55000, and nothing of the batch is written
SELECT id AS j1 FROM idem_outbox WHERE key = 'j1' \gset
SELECT attempt FROM idem_take('json');
SELECT idem_delivered_many(ARRAY[:j1, :j1], ARRAY[1, 2]);
SELECT key, state FROM idem_outbox WHERE topic = 'json';
-- empty or NULL arrays: a take that found nothing
SELECT idem_delivered_many(ARRAY[]::bigint[], ARRAY[]::integer[]);
SELECT idem_delivered_many(NULL, NULL);

-- bad input
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1', 'k2'], ARRAY['x']::bytea[]);
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1', NULL], ARRAY['x', 'y']::bytea[]);
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1', ''], ARRAY['x', 'y']::bytea[]);
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1'], ARRAY[NULL]::bytea[]);
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1'], ARRAY['x']::bytea[], ARRAY['[1]']::jsonb[]);
SELECT idem_enqueue_many('acme', 'mail', NULL, ARRAY['x']::bytea[]);
-- the tenant and the topic are checked before the arrays and their elements
SELECT idem_enqueue_many('', 'mail', ARRAY[''], ARRAY['x']::bytea[]);
SELECT idem_enqueue_many('acme', '', NULL, ARRAY['x']::bytea[]);
-- every array's shape before the lengths; each element whole (key,
-- payload, headers) before the next
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1', 'k2'], ARRAY['x']::bytea[], ARRAY[ARRAY['{}']]::jsonb[]);
SET idem.max_body_size = '1kB';
SELECT idem_enqueue_many('acme', 'mail', ARRAY['k1', ''], ARRAY[repeat('x', 2000)::bytea, 'y']);
RESET idem.max_body_size;
SELECT idem_delivered_many(ARRAY[:j1], ARRAY[1, 2]);
SELECT idem_delivered_many(ARRAY[:j1], NULL);
SELECT idem_delivered_many(ARRAY[:j1], ARRAY[1], ARRAY[700]);
SELECT idem_delivered_many(ARRAY[:j1], ARRAY[1], NULL, ARRAY['a', 'b']::bytea[]);
SELECT count(*) FROM idem_outbox WHERE key LIKE 'k%';

-- the tenant binding: a bound role enqueues its own tenant's messages and
-- finishes no other tenant's
CREATE ROLE batch_acme LOGIN;
SELECT idem_bind('batch_acme', 'acme');
SELECT id AS g1 FROM idem_enqueue('globex', 'mail', 'g1', 'x'::bytea) \gset
SELECT attempt FROM idem_take('mail', 1, tenant => 'globex');
SET ROLE batch_acme;
SELECT count(*) FROM idem_enqueue_many('globex', 'mail', ARRAY['g2'], ARRAY['x']::bytea[]);
-- the binding before the elements: another tenant's batch with a bad key,
-- and an empty one
SELECT count(*) FROM idem_enqueue_many('globex', 'mail', ARRAY[''], ARRAY['x']::bytea[]);
SELECT count(*) FROM idem_enqueue_many('globex', 'mail', '{}', '{}'::bytea[]);
SELECT idem_delivered_many(ARRAY[:g1], ARRAY[1]);
RESET ROLE;
SELECT idem_unbind('batch_acme');
DROP ROLE batch_acme;

DROP EXTENSION idem;
