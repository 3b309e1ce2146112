-- idem.max_retention and idem.max_lease: a DBA's caps on what a claim may
-- ask for, by argument or by setting; they bind every role
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT name, setting, unit, context FROM pg_settings
 WHERE name IN ('idem.max_retention', 'idem.max_lease') ORDER BY name;

-- superuser-only
CREATE ROLE caps_app LOGIN;
GRANT USAGE ON SCHEMA public TO caps_app;
SET ROLE caps_app;
SET idem.max_retention = '10d';
SET idem.max_lease = '1h';
RESET ROLE;

SET idem.max_retention = '12h';
SET idem.max_lease = '10min';
SHOW idem.max_retention;

-- the default retention (24h) is over the cap: every claim that takes it errors
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1');
-- an argument over the cap
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1', retention => '2 days');
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1', retention => '6h', lease => '1 hour');
-- a setting over the cap, as a role's setting or SET gives it
SET idem.lease = '20min';
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1', retention => '6h');
RESET idem.lease;
-- a lease that would end after idem.max_retention (it would keep the record
-- that long), by argument and by setting, in a claim and in a batch
SET idem.max_lease = 0;
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1', retention => '6h', lease => '1000 days');
SELECT outcome FROM idem_claim_many('acme', 'POST /caps', ARRAY['k1'], retention => '6h', lease => '13 hours');
SET idem.lease = '13h';
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k1', retention => '6h');
RESET idem.lease;
SET idem.max_lease = '10min';
-- nothing was written
SELECT count(*) FROM idem_record WHERE endpoint = 'POST /caps';

-- within the caps, and at them
SELECT outcome, attempt FROM idem_claim('acme', 'POST /caps', 'k1', retention => '6h');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /caps', 'k2', retention => '12h', lease => '10min');
SET idem.retention = '12h';
SELECT outcome, attempt FROM idem_claim('acme', 'POST /caps', 'k3');
RESET idem.retention;

-- 0: no cap
SET idem.max_retention = 0;
SET idem.max_lease = 0;
SELECT outcome FROM idem_claim('acme', 'POST /caps', 'k4', retention => '1000 years', lease => '30 days');

SELECT count(*) FROM idem_record WHERE endpoint = 'POST /caps';
DELETE FROM idem_record WHERE endpoint = 'POST /caps';
RESET idem.max_retention;
RESET idem.max_lease;
REVOKE USAGE ON SCHEMA public FROM caps_app;
DROP ROLE caps_app;
DROP EXTENSION idem;
