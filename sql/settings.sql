--
-- settings.sql: idem's configuration parameters
--
CREATE EXTENSION idem;

-- (what the server's configuration sets for the worker is not shown: the
-- suites' temporary servers and an installcheck server differ there)
SELECT name, CASE WHEN context = 'sighup' THEN '(server)' ELSE setting END AS setting,
	   unit, context, boot_val
  FROM pg_settings WHERE name LIKE 'idem.%' ORDER BY name;
SHOW idem.retention;
SHOW idem.retry_window;
SHOW idem.lease;
SHOW idem.max_body_size;

-- values take units
SET idem.retention = '2d';
SHOW idem.retention;
SET idem.lease = '90s';
SHOW idem.lease;
RESET idem.retention;
RESET idem.lease;

-- the idem prefix is reserved: a misspelt setting is an error
SET idem.retension = '48h';

-- the worker's pace is set in the server's configuration only
SET idem.purge_interval = '5s';

-- a claim under settings that break the retention rule errors (22023)
-- and leaves nothing behind
SET idem.retention = '1h';
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'rule');
SET idem.retention = '30min';
\set VERBOSITY terse
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'rule');
\set VERBOSITY default
SELECT count(*) FROM idem_record;
RESET idem.retention;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'rule');

-- the body limit is the superuser's to set
CREATE ROLE idem_app;
SET ROLE idem_app;
SET idem.max_body_size = '10MB';
SET idem.retention = '48h';
RESET ROLE;
DROP ROLE idem_app;
DROP EXTENSION idem;
