--
-- errors.sql: every bad input is an ERROR with its own SQLSTATE, never a
-- NULL result or a silent no-op
--
CREATE EXTENSION idem;

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

-- NULL tenant, endpoint or key: 22004, for every function
SELECT pg_temp.err($$SELECT idem_claim(NULL, 'e', 'k')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', NULL, 'k')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', NULL)$$);
SELECT pg_temp.err($$SELECT idem_complete(NULL, 'e', 'k', 200, 'b')$$);
SELECT pg_temp.err($$SELECT idem_fail('t', NULL, 'k', 500, 'b')$$);
SELECT pg_temp.err($$SELECT idem_release('t', 'e', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_replay(NULL, 'e', 'k')$$);

-- empty: 22023
SELECT pg_temp.err($$SELECT idem_claim('', 'e', 'k')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', '', 'k')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', '')$$);
SELECT pg_temp.err($$SELECT * FROM idem_replay('t', 'e', '')$$);

-- longer than 255 bytes: 22001; 255 bytes is fine, counted in bytes
SELECT pg_temp.err(format('SELECT idem_claim(%L, ''e'', ''k'')', repeat('t', 256)));
SELECT pg_temp.err(format('SELECT idem_claim(''t'', %L, ''k'')', repeat('e', 300)));
SELECT pg_temp.err(format('SELECT idem_claim(''t'', ''e'', %L)', repeat('é', 128)));
SELECT pg_temp.err(format('SELECT idem_complete(''t'', ''e'', %L, 200, ''b'')', repeat('k', 256)));
SELECT outcome FROM idem_claim('t', 'e', repeat('k', 255));

-- status outside 100..599 or NULL
SELECT outcome FROM idem_claim('t', 'e', 'status');
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 99, 'b')$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 600, 'b')$$);
SELECT pg_temp.err($$SELECT idem_fail('t', 'e', 'status', -1, 'b')$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', NULL, 'b')$$);
-- the claim is still pending after those errors
SELECT outcome FROM idem_replay('t', 'e', 'status');

-- a body over idem.max_body_size: 54000, whatever its type
SET idem.max_body_size = '1kB';
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 200, repeat('x', 1025))$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 200, convert_to(repeat('x', 1025), 'UTF8'))$$);
SELECT pg_temp.err($$SELECT idem_fail('t', 'e', 'status', 500, to_jsonb(repeat('x', 1030)))$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 200, repeat('x', 1024))$$);
RESET idem.max_body_size;

-- finishing a key with no matching pending claim: 55000
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'never-claimed', 200, 'b')$$);
SELECT pg_temp.err($$SELECT idem_fail('t', 'e', 'never-claimed', 500, 'b')$$);
SELECT pg_temp.err($$SELECT idem_release('t', 'e', 'never-claimed')$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'status', 200, 'again')$$);
SELECT pg_temp.err($$SELECT idem_fail('t', 'e', 'status', 500, 'again')$$);
SELECT pg_temp.err($$SELECT idem_release('t', 'e', 'status')$$);
SELECT outcome FROM idem_claim('t', 'e', 'fenced');
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'fenced', 200, 'b', attempt => 2)$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'fenced', 200, 'b', attempt => 0)$$);

-- other NULL or invalid arguments
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', wait => NULL)$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '0 s')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '-1 min')$$);
-- intervals that leave timestamptz's range are bad arguments too (22023),
-- not a datetime overflow (22008)
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', retention => '-100000000 years')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', retention => '100000000 years')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '-100000000 years')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '2147483647 months')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '2562047788 hours')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', lease => '100000 years 2147483647 days')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', wait => true, wait_timeout => '-100000000 years')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'w', wait => true, wait_timeout => '100000000 years')$$);
-- a long one that stays in range is not refused
BEGIN;
SELECT outcome FROM idem_claim('t', 'e', 'w', lease => '200000 years', retention => '200000 years');
ROLLBACK;
SELECT pg_temp.err($$SELECT idem_fail('t', 'e', 'fenced', 500, 'b', retryable => NULL)$$);
-- none of those left a record behind
SELECT count(*) FROM idem_record WHERE key = 'w';

-- a claim's lease, retention and the retention rule are checked before the
-- key is looked at: the claim of a finished key is refused too, not replayed
SELECT outcome FROM idem_claim('t', 'e', 'checked-first');
SELECT idem_complete('t', 'e', 'checked-first', 200, 'b');
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'checked-first', lease => '-1 min')$$);
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'checked-first', retention => '1 min')$$);
SET idem.retry_window = '48h';
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'checked-first')$$);
RESET idem.retry_window;
SELECT outcome, status FROM idem_claim('t', 'e', 'checked-first');

-- the caller's transaction is left exactly as PostgreSQL's own errors
-- leave it: aborted until rolled back, and the claim before it gone
BEGIN;
SELECT outcome FROM idem_claim('t', 'e', 'in-tx');
SELECT idem_complete('t', 'e', 'in-tx', 700, 'b');
SELECT 1;
ROLLBACK;
SELECT count(*) FROM idem_record WHERE key = 'in-tx';

-- messages name the value
SELECT idem_complete('t', 'e', 'status', 42, 'b');
SELECT idem_complete('t', 'e', 'never-claimed', 200, 'b');
SELECT idem_claim('t', 'e', repeat('k', 256));
DROP EXTENSION idem;
