--
-- batch.sql: idem_claim_many, idem_complete_many and idem_fail_many, element
-- by element against the single calls in the same states
--
CREATE EXTENSION idem;
\pset null '(null)'

-- run one statement; say the SQLSTATE and message it raised
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- the same states under two endpoints: a finished key, a business failure,
-- a retryable failure, a released claim, a committed pending claim within
-- its lease and one whose lease ran out
CREATE FUNCTION pg_temp.prepare(e text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem_claim('acme', e, 'done', 'req'::bytea);
	PERFORM idem_complete('acme', e, 'done', 201, 'made'::bytea,
						  headers => '{"Location": "/o/1"}');
	PERFORM idem_claim('acme', e, 'declined');
	PERFORM idem_fail('acme', e, 'declined', 402, 'no'::bytea);
	PERFORM idem_claim('acme', e, 'retry', 'req'::bytea);
	PERFORM idem_fail('acme', e, 'retry', 503, 'later'::bytea, retryable => true);
	PERFORM idem_claim('acme', e, 'released');
	PERFORM idem_release('acme', e, 'released');
	PERFORM idem_claim('acme', e, 'pending', lease => '1 hour');
	PERFORM idem_claim('acme', e, 'stale', lease => '1 ms');
END
$$;
SELECT pg_temp.prepare('POST /single'), pg_temp.prepare('POST /batch');
SELECT pg_sleep(0.01);

-- one idem_claim per element, each a statement of its own, in order
CREATE FUNCTION pg_temp.singles(e text, keys text[], fps bytea[])
RETURNS TABLE (n bigint, key text, outcome text, status integer, body bytea,
			   headers jsonb, attempt integer, remembered_for interval)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. cardinality(keys) LOOP
		RETURN QUERY SELECT i::bigint, keys[i], c.outcome, c.status, c.body,
							c.headers, c.attempt,
							date_trunc('minute', c.expires_at - c.created_at)
					   FROM idem_claim('acme', e, keys[i], fps[i]) c;
	END LOOP;
END
$$;

-- a fresh key, a replay, a mismatch, a key without a fingerprint, a
-- business failure replayed, a retryable failure and a release claimed
-- again, in_progress, unknown, and a key twice: the second occurrence is
-- the batch's own claim, in_progress, as for a second idem_claim in the
-- transaction
CREATE TEMP TABLE input AS
SELECT ARRAY['new', 'done', 'done', 'done', 'declined', 'retry', 'released',
			 'pending', 'stale', 'dup', 'dup'] AS keys,
	   ARRAY['req', 'req', 'other', NULL, NULL, 'req', 'req', NULL, NULL,
			 NULL, NULL]::bytea[] AS fps;

CREATE TEMP TABLE single AS
SELECT s.* FROM input, pg_temp.singles('POST /single', keys, fps) s;
CREATE TEMP TABLE batch AS
SELECT b.n, b.key, b.outcome, b.status, b.body, b.headers, b.attempt,
	   date_trunc('minute', b.expires_at - b.created_at) AS remembered_for
  FROM input, idem_claim_many('acme', 'POST /batch', keys, fps)
	   WITH ORDINALITY AS b(key, outcome, status, body, headers, attempt,
							created_at, expires_at, n);

SELECT n, key, outcome, status, convert_from(body, 'UTF8') AS body, headers,
	   attempt, remembered_for FROM batch ORDER BY n;
-- element by element what the single claims answered
SELECT count(*) AS elements,
	   count(*) FILTER (WHERE (s.key, s.outcome, s.status, s.body,
							  s.headers::text, s.attempt, s.remembered_for)
							 IS NOT DISTINCT FROM
							 (b.key, b.outcome, b.status, b.body,
							  b.headers::text, b.attempt, b.remembered_for))
		   AS same
  FROM single s FULL JOIN batch b USING (n);

-- the records are the same too
SELECT key, state, attempt, count(DISTINCT endpoint) AS endpoints,
	   count(*) AS records
  FROM idem_record WHERE tenant = 'acme'
 GROUP BY key, state, attempt HAVING count(*) <> 2;

-- under REPEATABLE READ too a repeated key is the batch's own claim, not a
-- serialization failure: each element sees what the earlier ones wrote
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT key, outcome, attempt FROM idem_claim_many('acme', 'POST /rr', ARRAY['r1', 'r1', 'r2']);
SELECT key, outcome FROM idem_claim_many('acme', 'POST /rr', ARRAY['r2']);
ROLLBACK;

-- the text and jsonb overloads digest as idem_claim's do: the jsonb one
-- canonically
SELECT key, outcome FROM idem_claim_many('acme', 'POST /text', ARRAY['t1', 't2'],
										 ARRAY['amount=10', 'amount=11']);
SELECT key, outcome FROM idem_claim_many('acme', 'POST /text', ARRAY['t1', 't2'],
										 ARRAY[convert_to('amount=10', 'UTF8'),
											   convert_to('amount=10', 'UTF8')]);
SELECT key, outcome FROM idem_claim_many('acme', 'POST /json', ARRAY['j1'],
										 ARRAY['{"a": 1, "b": 2}'::jsonb]);
SELECT key, outcome FROM idem_claim_many('acme', 'POST /json', ARRAY['j1', 'j1'],
										 ARRAY['{ "b":2,"a":1 }'::jsonb, '{"a": 2}']);

-- a lease and a retention, named
SELECT key, outcome, attempt, expires_at - created_at AS remembered_for
  FROM idem_claim_many(tenant => 'acme', endpoint => 'POST /named',
					   keys => ARRAY['n1'], lease => '10 min',
					   retention => '2 days');

-- an empty batch answers nothing and finishes nothing
SELECT count(*) FROM idem_claim_many('acme', 'POST /batch', '{}');
SELECT idem_complete_many('acme', 'POST /batch', '{}', '{}', '{}');

-- complete what the batch claimed: every key replays its own response; a
-- NULL body is no body, a NULL attempt no fencing token
SELECT idem_complete_many('acme', 'POST /batch',
						  ARRAY['new', 'retry', 'released', 'dup'],
						  ARRAY[201, 200, 200, 204],
						  ARRAY['n', 'r', 'l', NULL]::bytea[],
						  ARRAY[1, 2, NULL, 1],
						  ARRAY['{"Location": "/n"}', NULL, NULL, '{}']::jsonb[]);
SELECT key, outcome, status, convert_from(body, 'UTF8') AS body, headers, attempt
  FROM idem_claim_many('acme', 'POST /batch', ARRAY['new', 'retry', 'released', 'dup']);

-- arrays whose subscripts start elsewhere than 1 are taken element by
-- element, as any other array
SELECT key, outcome FROM idem_claim_many('acme', 'POST /bounds', '[0:1]={b1,b2}'::text[],
										 '[5:6]={p,q}'::text[]);
SELECT idem_complete_many('acme', 'POST /bounds', '[3:4]={b1,b2}'::text[],
						  '[0:1]={201,202}'::integer[], '[-1:0]={x,y}'::bytea[],
						  '[7:8]={1,1}'::integer[], '[2:3]={"{}",NULL}'::jsonb[]);
SELECT key, outcome, status, convert_from(body, 'UTF8') AS body
  FROM idem_claim_many('acme', 'POST /bounds', ARRAY['b1', 'b2'], ARRAY['p', 'q']);

-- fail: a business failure is replayed, a retryable one claimed again
SELECT key, outcome, attempt
  FROM idem_claim_many('acme', 'POST /fail', ARRAY['f1', 'f2', 'f3']);
SELECT idem_fail_many('acme', 'POST /fail', ARRAY['f1'], ARRAY[402], ARRAY['declined']::bytea[]);
SELECT idem_fail_many('acme', 'POST /fail', ARRAY['f2', 'f3'], ARRAY[503, 500],
					  NULL, retryable => true, attempts => ARRAY[1, 1]);
SELECT key, outcome, status, convert_from(body, 'UTF8') AS body, attempt
  FROM idem_claim_many('acme', 'POST /fail', ARRAY['f1', 'f2', 'f3']);

-- a key without a matching pending claim is idem_complete's 55000, and the
-- whole call errors: nothing of it is finished
SELECT count(*) FROM idem_claim_many('acme', 'POST /fence', ARRAY['a', 'b']);
SELECT pg_temp.err($$SELECT idem_complete_many('acme', 'POST /fence', ARRAY['a', 'b'],
											   ARRAY[200, 200], NULL, ARRAY[1, 2])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('acme', 'POST /fence', ARRAY['a', 'never'],
											   ARRAY[200, 200], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('acme', 'POST /fence', ARRAY['a', 'a'],
											   ARRAY[200, 200], NULL)$$);
SELECT pg_temp.err($$SELECT idem_fail_many('acme', 'POST /fence', ARRAY['a', 'b'],
										   ARRAY[500, 500], NULL, attempts => ARRAY[1, 7])$$);
SELECT key, outcome, attempt FROM idem_claim_many('acme', 'POST /fence', ARRAY['a', 'b']);
-- the error's context names the element
SELECT idem_complete_many('acme', 'POST /fence', ARRAY['a', 'never'], ARRAY[200, 200], NULL);
SELECT * FROM idem_claim_many('acme', 'POST /fence', ARRAY['a', 'b', '']);

-- bad input is refused before anything is written: the valid first key of
-- each call below is claimed by none of them
SELECT pg_temp.err($$SELECT * FROM idem_claim_many(NULL, 'e', ARRAY['w'])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', '', ARRAY['w'])$$);
-- the tenant and the endpoint are checked before the arrays and their elements
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('', 'e', ARRAY[''])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', '', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many(repeat('t', 256), 'e', ARRAY['w'], ARRAY['f', 'g']::bytea[])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('', 'e', ARRAY[''], ARRAY[42], NULL)$$);
SELECT pg_temp.err($$SELECT idem_fail_many('t', '', ARRAY['w'], ARRAY[500, 1], NULL)$$);
-- fingerprints are checked as given: an empty array is not "none given",
-- and one of two dimensions is refused, not flattened
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w'], ARRAY[]::bytea[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w'], ARRAY[]::text[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w', 'x'], ARRAY[['f'], ['g']]::bytea[])$$);
-- retryable before the elements, an empty batch's too
SELECT pg_temp.err($$SELECT idem_fail_many('t', 'e', ARRAY['w'], ARRAY[42], NULL, retryable => NULL)$$);
SELECT pg_temp.err($$SELECT idem_fail_many('t', 'e', '{}', '{}', NULL, retryable => NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w', NULL])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w', ''])$$);
SELECT pg_temp.err(format('SELECT * FROM idem_claim_many(''t'', ''e'', ARRAY[''w'', %L])',
						  repeat('k', 256)));
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w', 'x'], ARRAY['f']::bytea[])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY[['w', 'x'], ['y', 'z']])$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w'], lease => '0')$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['w'], retention => '1 min')$$);
SELECT pg_temp.err($$SELECT idem_complete_many(NULL, 'e', ARRAY['w'], ARRAY[200], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', NULL, ARRAY[200], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w'], NULL, NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, NULL], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   ARRAY['b']::bytea[])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   NULL, ARRAY[1, 1, 1])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   NULL, NULL, ARRAY[NULL]::jsonb[])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 42], NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   NULL, ARRAY[1, 0])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   NULL, NULL, ARRAY[NULL, '[1]']::jsonb[])$$);
SELECT pg_temp.err($$SELECT idem_fail_many('t', 'e', ARRAY['w'], ARRAY[500], NULL, retryable => NULL)$$);
SET idem.max_body_size = '1kB';
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['w', 'x'], ARRAY[200, 200],
											   ARRAY['', repeat('b', 1025)]::bytea[])$$);
RESET idem.max_body_size;
SELECT count(*) FROM idem_record WHERE tenant = 't';

-- the tenant binding is checked for the call: a bound role may batch its
-- own tenant's keys only
CREATE ROLE idem_batch_app;
SELECT idem_bind('idem_batch_app', 'acme');
SET ROLE idem_batch_app;
SELECT key, outcome FROM idem_claim_many('acme', 'POST /bound', ARRAY['b1']);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('globex', 'POST /bound', ARRAY['b1'])$$);
SELECT pg_temp.err($$SELECT idem_complete_many('globex', 'POST /bound', ARRAY['b1'], ARRAY[200], NULL)$$);
-- an empty batch too
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('globex', 'POST /bound', '{}')$$);
SELECT pg_temp.err($$SELECT idem_complete_many('globex', 'POST /bound', '{}', '{}', NULL)$$);
SELECT idem_complete_many('acme', 'POST /bound', ARRAY['b1'], ARRAY[200], NULL);
RESET ROLE;
SELECT idem_unbind('idem_batch_app');
DROP ROLE idem_batch_app;

-- after an error in the middle of a batch, the next calls work as before
BEGIN;
SELECT pg_temp.err($$SELECT idem_complete_many('acme', 'POST /fence', ARRAY['a', 'never'],
											   ARRAY[200, 200], NULL)$$);
SELECT key, outcome FROM idem_claim_many('acme', 'POST /after', ARRAY['x1', 'x2']);
SELECT outcome FROM idem_claim('acme', 'POST /after', 'x3');
COMMIT;
SELECT key, outcome FROM idem_claim_many('acme', 'POST /after', ARRAY['x1', 'x3', 'x4']);

DROP EXTENSION idem;
