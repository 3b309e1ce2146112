--
-- Never twice: a lease longer than the retention, fencing tokens across
-- expiry, purge and forget, a claim's own retention, and idem_replay with a
-- fingerprint.
--
CREATE EXTENSION idem;
SET idem.retry_window = '1s';
SET idem.retention = '3s';

-- a lease longer than the retention extends the record's life to its end
SELECT outcome, attempt, expires_at - created_at >= interval '1 hour' AS kept_for_lease
  FROM idem_claim('t', 'POST /lease', 'long', lease => '1 hour');

-- a pending record whose expiry passed (as idem 0.1.0 could write) while
-- its lease runs is live: not re-claimed, not purged, finished by attempt 1
UPDATE idem_record SET expires_at = now() - interval '1 s' WHERE key = 'long';
SELECT outcome, attempt FROM idem_claim('t', 'POST /lease', 'long');
SELECT outcome, attempt FROM idem_replay('t', 'POST /lease', 'long');
SELECT idem_purge();
SELECT idem_complete('t', 'POST /lease', 'long', 200, 'done', attempt => 1);
SELECT state, attempt FROM idem_record WHERE key = 'long';

-- an expired record still present: the next claim counts on from its attempt
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'k', lease => '1s');
UPDATE idem_record SET expires_at = now() - interval '1 s',
       lease_expires_at = now() - interval '1 s' WHERE key = 'k';
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'k');
-- the stale worker's token is refused
SELECT idem_complete('t', 'POST /fence', 'k', 200, 'stale', attempt => 1);
SELECT idem_complete('t', 'POST /fence', 'k', 200, 'ok', attempt => 2);

-- purged: the next claim starts above every attempt the key had
UPDATE idem_record SET expires_at = now() - interval '1 s',
       lease_expires_at = now() - interval '1 s' WHERE key = 'k';
SELECT idem_purge();
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'k');
SELECT idem_release('t', 'POST /fence', 'k', attempt => 2);
SELECT idem_release('t', 'POST /fence', 'k', attempt => 1);

-- forgotten by an operator: the same
SELECT idem_forget('t', 'POST /fence', 'k');
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'k');
SELECT idem_complete('t', 'POST /fence', 'k', 200, 'stale', attempt => 3);
-- a deleted record raised its bucket's floor; other keys count from 1
SELECT count(*) AS buckets, max(attempt) AS floor FROM idem_attempt_floor;
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'fresh');

-- a session in the replica role (a migration tool, a restore) fires no
-- ordinary trigger: the floor rises all the same, by idem_forget,
-- idem_purge or a DELETE by hand
SET session_replication_role = replica;
SELECT idem_forget('t', 'POST /fence', 'k');
RESET session_replication_role;
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'k');
SELECT idem_complete('t', 'POST /fence', 'k', 200, 'stale', attempt => 4);
UPDATE idem_record SET expires_at = now() - interval '1 s',
       lease_expires_at = now() - interval '1 s' WHERE key = 'fresh';
SET session_replication_role = replica;
SELECT idem_purge();
RESET session_replication_role;
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'fresh');
SELECT idem_complete('t', 'POST /fence', 'fresh', 200, 'stale', attempt => 1);
SET session_replication_role = replica;
DELETE FROM idem_record WHERE key = 'fresh';
RESET session_replication_role;
SELECT outcome, attempt FROM idem_claim('t', 'POST /fence', 'fresh');

-- a claim's own retention, instead of the session's idem.retention
SELECT outcome, expires_at - created_at AS kept
  FROM idem_claim('t', 'POST /ret', 'r1', retention => '2 hours');
-- it must be longer than the retry window, and nothing is written
SELECT outcome FROM idem_claim('t', 'POST /ret', 'r2', retention => '1 s');
SELECT outcome FROM idem_claim('t', 'POST /ret', 'r2', 'fp', retention => '500 ms');
SELECT count(*) FROM idem_record WHERE key = 'r2';

-- idem_replay answers what a claim would, mismatch included
RESET idem.retention;
SELECT outcome FROM idem_claim('t', 'POST /replay', 'p', 'request a');
SELECT outcome, attempt FROM idem_replay('t', 'POST /replay', 'p', 'request b');
SELECT outcome, attempt FROM idem_replay('t', 'POST /replay', 'p', 'request a');
SELECT outcome, attempt FROM idem_replay('t', 'POST /replay', 'p');
SELECT idem_complete('t', 'POST /replay', 'p', 201, 'made');
SELECT outcome, status, body FROM idem_replay('t', 'POST /replay', 'p', 'request a');
SELECT outcome FROM idem_replay('t', 'POST /replay', 'p', '\x00'::bytea);
SELECT outcome FROM idem_claim('t', 'POST /replay', 'j', '{"a": 1, "b": 2}'::jsonb);
SELECT idem_complete('t', 'POST /replay', 'j', 201, 'made');
SELECT outcome FROM idem_replay('t', 'POST /replay', 'j', '{"b":2,"a":1}'::jsonb);
SELECT outcome FROM idem_replay('t', 'POST /replay', 'j', '{"a": 2}'::jsonb);
-- a released key: a claim would execute, so no row, unless it mismatches
SELECT outcome FROM idem_claim('t', 'POST /replay', 'rel', 'request a');
SELECT idem_release('t', 'POST /replay', 'rel');
SELECT count(*) FROM idem_replay('t', 'POST /replay', 'rel', 'request a');
SELECT outcome FROM idem_replay('t', 'POST /replay', 'rel', 'request b');

RESET idem.retry_window;
DROP EXTENSION idem;
