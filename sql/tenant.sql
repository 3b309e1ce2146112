--
-- tenant.sql: the tenant binding, row-level security, privileges, and the
-- search_path attack
--
CREATE EXTENSION idem;
\pset null '(null)'
SELECT current_user AS superuser \gset

SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a1');
SELECT idem_complete('acme', 'POST /orders', 'a1', 201, 'acme order');
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
SELECT idem_complete('globex', 'POST /orders', 'g1', 201, 'globex secret');
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g2');

CREATE ROLE regress_acme LOGIN;
ALTER ROLE regress_acme SET idem.tenant = 'acme';
GRANT EXECUTE ON FUNCTION idem_list(text, text, boolean, integer) TO regress_acme;
GRANT EXECUTE ON FUNCTION idem_forget(text, text, text) TO regress_acme;

-- a role's binding is a superuser's to set
CREATE ROLE regress_other LOGIN;
SET ROLE regress_other;
ALTER ROLE regress_other SET idem.tenant = 'globex';
RESET ROLE;

\c - regress_acme
SHOW idem.tenant;
\set VERBOSITY terse

-- its own tenant: everything works
SELECT outcome, status, convert_from(body, 'UTF8') AS body FROM idem_claim('acme', 'POST /orders', 'a1');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a2');
SELECT idem_complete('acme', 'POST /orders', 'a2', 200, 'ok');
SELECT outcome, status FROM idem_replay('acme', 'POST /orders', 'a2');
SELECT endpoint, key, state, body FROM idem_list('acme');

-- another tenant: refused by every function, before touching anything
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'new');
SELECT idem_complete('globex', 'POST /orders', 'g2', 200, 'hijack');
SELECT idem_fail('globex', 'POST /orders', 'g2', 500, 'hijack', retryable => true);
SELECT idem_release('globex', 'POST /orders', 'g2');
SELECT * FROM idem_replay('globex', 'POST /orders', 'g1');
SELECT * FROM idem_list('globex');
SELECT idem_forget('globex', 'POST /orders', 'g1');
SELECT idem_purge();

-- it cannot unbind itself
SET idem.tenant = 'globex';
SET LOCAL idem.tenant = 'globex';
RESET idem.tenant;
SELECT set_config('idem.tenant', 'globex', false);
SELECT set_config('idem.tenant', '', false);
SHOW idem.tenant;

-- nor read or write the table
SELECT count(*) FROM idem_record;
UPDATE idem_record SET body = 'x';
DELETE FROM idem_record;

\c - :superuser
\set VERBOSITY default

-- globex's records are untouched
SELECT tenant, key, state, convert_from(body, 'UTF8') AS body
  FROM idem_record WHERE tenant = 'globex' ORDER BY key;

-- even granted the table, a bound role sees only its tenant's rows and
-- changes nothing
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_record TO regress_acme;
\c - regress_acme
\set VERBOSITY terse
SELECT tenant, key FROM idem_record ORDER BY tenant, key;
UPDATE idem_record SET body = 'x';
DELETE FROM idem_record;
INSERT INTO idem_record (tenant, endpoint, key, state, attempt, created_at,
                         claimed_at, lease_expires_at, expires_at)
VALUES ('globex', 'POST /orders', 'forged', 'succeeded', 1, now(), now(), now(), now() + '1 day');
\c - :superuser
\set VERBOSITY default
SELECT tenant, key, convert_from(body, 'UTF8') AS body FROM idem_record ORDER BY tenant, key;
REVOKE ALL ON idem_record FROM regress_acme;

-- an operator can forget a key, and the next claim executes again, fenced
-- above the forgotten record's attempt
SELECT idem_forget('acme', 'POST /orders', 'a2');
SELECT idem_forget('acme', 'POST /orders', 'a2');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /orders', 'a2');
SELECT key, state, body IS NULL AS no_body FROM idem_list('globex');
SELECT key, convert_from(body, 'UTF8') AS body FROM idem_list('globex', 'POST /orders', with_body => true, max_rows => 1);

-- the search_path attack: hostile functions and operators on the caller's
-- search_path are never run by an idem function
CREATE ROLE regress_attacker LOGIN;
CREATE SCHEMA evil AUTHORIZATION regress_attacker;
\c - regress_attacker
CREATE TABLE evil.calls (what text);
CREATE FUNCTION evil.log_call(what text) RETURNS void LANGUAGE sql
	AS $$ INSERT INTO evil.calls VALUES (what) $$;
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE sql
	AS $$ SELECT evil.log_call('='); SELECT a OPERATOR(pg_catalog.=) b $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE FUNCTION evil.byteaeq(a bytea, b bytea) RETURNS boolean LANGUAGE sql
	AS $$ SELECT evil.log_call('bytea ='); SELECT a OPERATOR(pg_catalog.=) b $$;
CREATE OPERATOR evil.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = evil.byteaeq);
CREATE FUNCTION evil.timestamptz_le(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE sql
	AS $$ SELECT evil.log_call('<='); SELECT a OPERATOR(pg_catalog.<=) b $$;
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.timestamptz_le);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql
	AS $$ SELECT evil.log_call('now'); SELECT pg_catalog.now() $$;
CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE sql
	AS $$ SELECT evil.log_call('current_setting'); SELECT 'acme' $$;
CREATE FUNCTION evil.coalesce(text, text) RETURNS text LANGUAGE sql
	AS $$ SELECT evil.log_call('coalesce'); SELECT $1 $$;
CREATE FUNCTION pg_temp.texteq(a text, b text) RETURNS boolean LANGUAGE sql
	AS $$ SELECT evil.log_call('pg_temp ='); SELECT a OPERATOR(pg_catalog.=) b $$;
CREATE OPERATOR pg_temp.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_temp.texteq);
CREATE TABLE pg_temp.idem_record (LIKE evil.calls);
SET search_path = pg_temp, evil, pg_catalog, public;
-- the operators are live: an unqualified = in the attacker's own query runs one
SELECT 'a' = 'a' AS hostile_operator_runs;
SELECT count(*) > 0 AS it_logged FROM evil.calls;
TRUNCATE evil.calls;
SELECT outcome FROM public.idem_claim('acme', 'POST /evil', 'k', 'fp');
SELECT outcome FROM public.idem_claim('acme', 'POST /evil', 'k', '{"a": 1}'::jsonb);
SELECT public.idem_complete('acme', 'POST /evil', 'k', 200, 'ok'::bytea);
SELECT outcome FROM public.idem_claim('acme', 'POST /evil', 'k', 'fp');
SELECT outcome FROM public.idem_replay('acme', 'POST /evil', 'k');
SELECT outcome FROM public.idem_claim('acme', 'POST /evil', 'k2');
SELECT public.idem_fail('acme', 'POST /evil', 'k2', 503, 'x'::bytea, retryable => true);
SELECT outcome FROM public.idem_claim('acme', 'POST /evil', 'k2');
SELECT public.idem_release('acme', 'POST /evil', 'k2');
SELECT count(*) AS hostile_calls FROM evil.calls;
\c - :superuser
SET search_path = evil, pg_catalog, public;
SELECT idem_purge();
SELECT count(*) FROM idem_list('acme');
SELECT count(*) AS hostile_calls FROM evil.calls;
RESET search_path;

DROP SCHEMA evil CASCADE;
DROP EXTENSION idem;
DROP ROLE regress_attacker;
DROP ROLE regress_acme;
DROP ROLE regress_other;
