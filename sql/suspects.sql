--
-- suspects.sql: idem_suspects finds one request under several keys (a
-- key made anew for every retry, two layers each retrying): records of one
-- tenant and endpoint with one fingerprint, each first claimed within
-- "within" of another, since "since" ago.  It reports, never merges; a
-- bound role sees its own tenant's groups only; the window is read through
-- the BRIN index on created_at.
--
CREATE EXTENSION idem;
\set VERBOSITY default
-- a client that makes a new key for every retry: 4 keys, 200 ms apart
SELECT c.outcome FROM generate_series(1, 4) i,
	   idem_claim('acme', 'POST /pay', 'r-' || i, '{"amount": 10}'::jsonb) c;
UPDATE idem_record SET created_at = created_at - (4 - substr(key, 3)::int) * interval '200 ms'
 WHERE key LIKE 'r-%';
-- the same body twice, two minutes apart; a third key with another body
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'late-1', '{"amount": 20}'::jsonb);
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'late-2', '{"amount": 20}'::jsonb);
UPDATE idem_record SET created_at = created_at - interval '2 minutes' WHERE key = 'late-1';
SELECT outcome FROM idem_claim('acme', 'POST /pay', 'other', '{"amount": 30}'::jsonb);
-- another tenant's retries, and records without a fingerprint
SELECT c.outcome FROM generate_series(1, 2) i,
	   idem_claim('globex', 'POST /pay', 'g-' || i, 'same'::bytea) c;
SELECT c.outcome FROM generate_series(1, 2) i, idem_claim('acme', 'POST /pay', 'n-' || i) c;

SELECT tenant, endpoint, keys, last_at - first_at < interval '1 minute' AS within_a_minute
  FROM idem_suspects('1 hour', '1 minute') ORDER BY tenant;
-- a wider within joins the two late keys; a shorter since leaves the old ones
SELECT tenant, keys FROM idem_suspects('1 hour', '3 minutes') ORDER BY tenant, keys;
SELECT tenant, keys FROM idem_suspects('1 minute') ORDER BY tenant, keys;
-- expired records are no suspects
UPDATE idem_record SET expires_at = now() - interval '1 s' WHERE tenant = 'globex';
SELECT tenant, keys FROM idem_suspects() ORDER BY tenant;

-- the binding: a bound role granted the function sees its own tenant only
UPDATE idem_record SET expires_at = now() + interval '1 day' WHERE tenant = 'globex';
CREATE ROLE suspects_globex LOGIN;
SELECT idem_bind('suspects_globex', 'globex');
GRANT EXECUTE ON FUNCTION idem_suspects(interval, interval) TO suspects_globex;
SET ROLE suspects_globex;
SELECT tenant, keys FROM idem_suspects();
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_suspects(interval, interval) FROM suspects_globex;
SET ROLE suspects_globex;
SELECT count(*) FROM idem_suspects();
RESET ROLE;
SELECT idem_unbind('suspects_globex');
DROP ROLE suspects_globex;

-- bad input
SELECT idem_suspects(NULL);
SELECT idem_suspects('1 hour', NULL);

-- the plan reads only the window, through the BRIN index
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT * FROM idem_record WHERE created_at >= now() - interval '1 hour';
RESET enable_seqscan;

DROP EXTENSION idem;
