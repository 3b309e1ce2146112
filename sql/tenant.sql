--
-- tenant.sql: the tenant binding (idem_bind), SET ROLE, role membership,
-- security definer functions, idem.require_binding, row-level security,
-- privileges, and the search_path attack
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
CREATE ROLE regress_other LOGIN;
SELECT idem_bind('regress_acme', 'acme');
SELECT role, tenant FROM idem_binding;
GRANT EXECUTE ON FUNCTION idem_list(text, text, boolean, integer) TO regress_acme;
GRANT EXECUTE ON FUNCTION idem_forget(text, text, text) TO regress_acme;

-- a role's binding is a superuser's to set, by no other means
SET ROLE regress_other;
\set VERBOSITY terse
SELECT idem_bind('regress_other', 'globex');
SELECT idem_unbind('regress_acme');
INSERT INTO idem_binding VALUES ('regress_other', 'globex');
DELETE FROM idem_binding;
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_bind(regrole, text) TO regress_other;
GRANT EXECUTE ON FUNCTION idem_unbind(regrole) TO regress_other;
SET ROLE regress_other;
SELECT idem_bind('regress_other', 'globex');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT idem_unbind('regress_acme');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_bind(regrole, text) FROM regress_other;
REVOKE EXECUTE ON FUNCTION idem_unbind(regrole) FROM regress_other;

-- bad bindings
SELECT idem_bind(NULL, 'acme');
SELECT idem_bind('regress_other', NULL);
SELECT idem_bind('regress_other', '');
SELECT idem_bind('regress_other', repeat('t', 256));
SELECT idem_bind('regress_nobody', 'acme');
SELECT idem_bind(12345::oid::regrole, 'acme');
SELECT idem_unbind(NULL);
\set VERBOSITY default
SELECT role, tenant FROM idem_binding;

\c - regress_acme
SELECT idem_tenant();
\set VERBOSITY terse

-- its own tenant: everything works
SELECT outcome, status, convert_from(body, 'UTF8') AS body FROM idem_claim('acme', 'POST /orders', 'a1');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'a2');
SELECT idem_complete('acme', 'POST /orders', 'a2', 200, 'ok');
SELECT outcome, status FROM idem_replay('acme', 'POST /orders', 'a2');
SELECT endpoint, key, state, body FROM idem_list('acme');

-- another tenant: refused by every function, before touching anything
\set VERBOSITY default
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
\set VERBOSITY terse
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'new');
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1', '{"a": 1}'::jsonb);
SELECT idem_complete('globex', 'POST /orders', 'g2', 200, 'hijack');
SELECT idem_complete('globex', 'POST /orders', 'g2', 200, '{"a": 1}'::jsonb);
SELECT idem_fail('globex', 'POST /orders', 'g2', 500, 'hijack', retryable => true);
SELECT idem_fail('globex', 'POST /orders', 'g2', 500, '{"a": 1}'::jsonb);
SELECT idem_release('globex', 'POST /orders', 'g2');
SELECT * FROM idem_replay('globex', 'POST /orders', 'g1');
SELECT * FROM idem_list('globex');
SELECT idem_forget('globex', 'POST /orders', 'g1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT idem_purge();

-- no setting unbinds it: idem.tenant is gone, and the rest are not its
SET idem.tenant = 'globex';
SELECT set_config('idem.tenant', '', false);
SET idem.require_binding = off;
SELECT idem_tenant();

-- nor can it read or write the table
SELECT count(*) FROM idem_record;
UPDATE idem_record SET body = 'x';
DELETE FROM idem_record;
SELECT count(*) FROM idem_binding;

\c - :superuser
\set VERBOSITY default

-- globex's records are untouched
SELECT tenant, key, state, convert_from(body, 'UTF8') AS body
  FROM idem_record WHERE tenant = 'globex' ORDER BY key;

-- even granted the table, a bound role sees only its tenant's rows and
-- changes nothing
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_record TO regress_acme, regress_other;
\c - regress_acme
\set VERBOSITY terse
SELECT tenant, key FROM idem_record ORDER BY tenant, key;
SELECT tenant, key FROM idem_record WHERE tenant = 'globex';
UPDATE idem_record SET body = 'x';
DELETE FROM idem_record;
INSERT INTO idem_record (tenant, endpoint, key, state, attempt, created_at,
                         claimed_at, lease_expires_at, expires_at)
VALUES ('globex', 'POST /orders', 'forged', 'succeeded', 1, now(), now(), now(), now() + '1 day');
\c - :superuser
\set VERBOSITY default
SELECT tenant, key, convert_from(body, 'UTF8') AS body FROM idem_record ORDER BY tenant, key;

-- SET ROLE binds as a login does; RESET ROLE ends it
\set VERBOSITY terse
SET ROLE regress_acme;
SELECT idem_tenant();
SELECT * FROM idem_replay('globex', 'POST /orders', 'g1');
SELECT tenant, key FROM idem_record ORDER BY tenant, key;
RESET ROLE;
SELECT idem_tenant();
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
BEGIN;
SET LOCAL ROLE regress_acme;
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
ROLLBACK;
-- the binding is checked before the finish's other arguments: another
-- tenant's key with a bad status is refused for the tenant
BEGIN;
SET LOCAL ROLE regress_acme;
SELECT idem_complete('globex', 'POST /orders', 'g1', 999, 'x');
ROLLBACK;
BEGIN;
SET LOCAL ROLE regress_acme;
SELECT idem_fail('globex', 'POST /orders', 'g1', 500, 'x', retryable => NULL);
ROLLBACK;
BEGIN;
SET LOCAL ROLE regress_acme;
SELECT idem_release('globex', 'POST /orders', 'g1', attempt => 0);
ROLLBACK;

-- the bindings are read once per role and cached: fifty calls scan nothing
SET ROLE regress_acme;
SELECT idem_tenant();
BEGIN;
SELECT pg_stat_get_xact_numscans('idem_binding'::regclass) AS scans_before \gset
SELECT count(*) FROM generate_series(1, 50) i,
	idem_replay('acme', 'POST /orders', 'a' || (i % 2 + 1)) r;
SELECT pg_stat_get_xact_numscans('idem_binding'::regclass) - :scans_before AS binding_scans;
COMMIT;
RESET ROLE;

-- a role that inherits a bound role's privileges is bound; one that does
-- not inherit them has neither them nor the binding
CREATE ROLE regress_acme_member IN ROLE regress_acme;
CREATE ROLE regress_acme_noinherit NOINHERIT IN ROLE regress_acme;
CREATE ROLE regress_nested IN ROLE regress_acme_member;
SET ROLE regress_acme_member;
SELECT idem_tenant();
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
SET ROLE regress_acme_noinherit;
SELECT idem_tenant();
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
SET ROLE regress_nested;
SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1');
SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1');
RESET ROLE;

-- a role with the privileges of roles bound to different tenants may touch
-- neither
CREATE ROLE regress_globex;
SELECT idem_bind('regress_globex', 'globex');
GRANT regress_globex TO regress_acme_member;
SET ROLE regress_acme_member;
SELECT idem_tenant();
\set VERBOSITY default
SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
\set VERBOSITY terse
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
RESET ROLE;
REVOKE regress_globex FROM regress_acme_member;
SET ROLE regress_acme_member;
SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1');
RESET ROLE;

-- security definer functions: a bound caller stays bound in a function of
-- an unbound role, and a function of a bound role is bound for any caller
CREATE FUNCTION public.replay_as_other(t text) RETURNS text
	LANGUAGE sql SECURITY DEFINER
	AS $$ SELECT outcome || ' ' || convert_from(body, 'UTF8') FROM public.idem_replay(t, 'POST /orders', 'g1') $$;
ALTER FUNCTION public.replay_as_other(text) OWNER TO regress_other;
CREATE FUNCTION public.replay_as_acme(t text) RETURNS text
	LANGUAGE sql SECURITY DEFINER
	AS $$ SELECT outcome || ' ' || convert_from(body, 'UTF8') FROM public.idem_replay(t, 'POST /orders', 'g1') $$;
ALTER FUNCTION public.replay_as_acme(text) OWNER TO regress_acme;
SELECT public.replay_as_other('globex');
SET ROLE regress_other;
SELECT public.replay_as_other('globex');
SELECT public.replay_as_acme('globex');
RESET ROLE;
SET ROLE regress_acme;
\set VERBOSITY default
SELECT public.replay_as_other('globex');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
\set VERBOSITY terse
RESET ROLE;
\c - regress_acme
\set VERBOSITY terse
SELECT public.replay_as_other('globex');
\c - :superuser
\set VERBOSITY terse

-- idem.require_binding: a non-superuser bound to nothing touches nothing
SET idem.require_binding = on;
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
SET ROLE regress_other;
SELECT idem_tenant();
\set VERBOSITY default
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
\set VERBOSITY terse
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'new');
SELECT tenant, key FROM idem_record;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
RESET ROLE;
SET ROLE regress_acme;
SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1');
RESET ROLE;
RESET idem.require_binding;
SET ROLE regress_other;
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
SELECT count(*) FROM idem_record;
RESET ROLE;

-- unbinding frees the role, at once in this session
SELECT idem_unbind('regress_acme');
SELECT idem_unbind('regress_acme');
SET ROLE regress_acme;
SELECT idem_tenant();
SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
RESET ROLE;
BEGIN;
SELECT idem_bind('regress_acme', 'acme');
SET LOCAL ROLE regress_acme;
SELECT idem_tenant();
ROLLBACK;
SET ROLE regress_acme;
SELECT idem_tenant();
RESET ROLE;
SELECT idem_bind('regress_acme', 'acme');
SELECT idem_bind('regress_acme', 'initech');
SELECT role, tenant FROM idem_binding ORDER BY tenant;
\set VERBOSITY default

DROP FUNCTION public.replay_as_other(text);
DROP FUNCTION public.replay_as_acme(text);
REVOKE ALL ON idem_record FROM regress_acme, regress_other;

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
SELECT idem_forget('acme', 'POST /evil', 'k2');
SELECT count(*) AS hostile_calls FROM evil.calls;
-- the path that idem pins for its statements ends with them
SHOW search_path;
RESET search_path;

DROP SCHEMA evil CASCADE;
DROP EXTENSION idem;
DROP ROLE regress_attacker;
DROP ROLE regress_nested;
DROP ROLE regress_acme_member;
DROP ROLE regress_acme_noinherit;
DROP ROLE regress_globex;
DROP ROLE regress_acme;
DROP ROLE regress_other;
