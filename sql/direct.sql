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

DROP EXTENSION idem;
