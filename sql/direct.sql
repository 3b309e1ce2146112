--
-- Direct record access: no plan to lose.  After a purge and VACUUM leave
-- the table empty and a pooler's DISCARD ALL drops every cached plan, the
-- table grows again: claims, finishes and replays still find keys through
-- the unique index, and the SQL statements of the operator tools are
-- planned again with sequential scans off, so nothing scans the table.
--
CREATE EXTENSION idem;

TRUNCATE idem_record, idem_attempt_floor;
VACUUM ANALYZE idem_record;
SELECT pg_stat_force_next_flush();
SELECT seq_scan AS seq_before FROM pg_stat_user_tables
 WHERE relname = 'idem_record' \gset
-- a first look-up after the VACUUM, then the pooler's DISCARD ALL
SELECT count(*) FROM idem_replay('d', 'POST /x', 'k1');
SELECT count(*) FROM idem_list('d');
DISCARD ALL;
-- the operator tools' statements are planned again while the table is empty
SELECT idem_forget('d', 'POST /x', 'none');

SELECT count(*) FILTER (WHERE c.outcome = 'claimed') AS claimed
  FROM generate_series(1, 3000) g, LATERAL idem_claim('d', 'POST /x', 'k' || g) c;
DISCARD ALL;
SELECT count(*) AS completed
  FROM generate_series(1, 3000) g,
	   LATERAL idem_complete('d', 'POST /x', 'k' || g, 201, 'ok') c;
SELECT count(*) FILTER (WHERE c.outcome = 'replay') AS replayed
  FROM generate_series(1, 3000) g, LATERAL idem_replay('d', 'POST /x', 'k' || g) c;
SELECT idem_forget('d', 'POST /x', 'k1');
SELECT count(*) FROM idem_list('d', max_rows => 5);
SELECT pg_stat_force_next_flush();
SELECT seq_scan - :seq_before AS seq_scans_of_idem_record
  FROM pg_stat_user_tables WHERE relname = 'idem_record';

-- a direct insert reads the fencing floor: the forgotten key's next
-- claim starts above the forgotten record's attempt
SELECT outcome, attempt FROM idem_claim('d', 'POST /x', 'k1');

-- the table's own rules: a CHECK constraint that a DBA adds is enforced on
-- the direct path, for a claim (an insert) and for a finish (an update),
-- and the error names it (in its message and in its fields, as core's
-- own); the same holds for idem_outbox
\set VERBOSITY terse
ALTER TABLE idem_record ADD CONSTRAINT no_test_keys CHECK (key NOT LIKE 'test-%');
ALTER TABLE idem_record ADD CONSTRAINT no_teapots CHECK (status IS DISTINCT FROM 418);
SELECT outcome FROM idem_claim('d', 'POST /x', 'test-1');
SELECT outcome FROM idem_claim('d', 'POST /x', 'k-teapot');
SELECT idem_complete('d', 'POST /x', 'k-teapot', 418, 'short and stout');
SELECT idem_complete('d', 'POST /x', 'k-teapot', 200, 'ok');
ALTER TABLE idem_outbox ADD CONSTRAINT no_test_topics CHECK (topic NOT LIKE 'test-%');
SELECT outcome FROM idem_enqueue('d', 'test-topic', 'k', 'x'::bytea);
DO $$
DECLARE
	t text;
	c text;
BEGIN
	PERFORM idem_claim('d', 'POST /x', 'test-2');
EXCEPTION WHEN check_violation THEN
	GET STACKED DIAGNOSTICS t = TABLE_NAME, c = CONSTRAINT_NAME;
	RAISE NOTICE 'SQLSTATE %, table %, constraint %', SQLSTATE, t, c;
END
$$;
\set VERBOSITY default
ALTER TABLE idem_record DROP CONSTRAINT no_test_keys, DROP CONSTRAINT no_teapots;
ALTER TABLE idem_outbox DROP CONSTRAINT no_test_topics;
SELECT outcome FROM idem_claim('d', 'POST /x', 'test-1');

-- under REPEATABLE READ, a record this transaction wrote is its own even in
-- the statement that wrote it, as ExecCheckTupleVisible has it: a claim and
-- its complete in one statement are no serialization failure
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT (idem_claim('d', 'POST /rr', 'one-statement')).outcome,
	   idem_complete('d', 'POST /rr', 'one-statement', 200, 'done');
SELECT outcome, status FROM idem_claim('d', 'POST /rr', 'one-statement');
COMMIT;

DROP EXTENSION idem;
