--
-- readonly.sql: a read-only transaction cannot claim, finish or batch
-- (25006), and replays (the SQL edition differs: sql-edition/README.md)
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

SELECT outcome FROM idem_claim('t', 'e', 'done');
SELECT idem_complete('t', 'e', 'done', 200, 'b');
SELECT outcome FROM idem_claim('t', 'e', 'open');

BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT idem_claim('t', 'e', 'ro')$$);
SELECT pg_temp.err($$SELECT * FROM idem_claim_many('t', 'e', ARRAY['ro'])$$);
SELECT pg_temp.err($$SELECT idem_complete('t', 'e', 'open', 200, 'b')$$);
SELECT pg_temp.err($$SELECT idem_complete_many('t', 'e', ARRAY['open'], ARRAY[200], NULL)$$);
SELECT pg_temp.err($$SELECT * FROM idem_enqueue_many('t', 'mail', ARRAY['ro'], ARRAY['x']::bytea[])$$);
SELECT outcome, status FROM idem_replay('t', 'e', 'done');
COMMIT;

DROP EXTENSION idem;
