--
-- schema.sql: what CREATE EXTENSION builds, and what pg_dump relies on
--
CREATE SCHEMA api;
CREATE EXTENSION idem SCHEMA api;

-- everything lives in the schema the DBA named
SELECT e.extname, n.nspname, e.extversion, e.extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'idem';
-- (types left out: 17 and later also list a table's row and array types)
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND classid <> 'pg_type'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
 ORDER BY 1;

-- pg_dump dumps the records (no filter) and the bindings of existing roles
SELECT extconfig::regclass[], extcondition FROM pg_extension WHERE extname = 'idem';

-- the table: columns, the unique key, the purge index, fillfactor for HOT
\d api.idem_record
SELECT reloptions FROM pg_class WHERE oid = 'api.idem_record'::regclass;

-- no function is SECURITY DEFINER: the API runs as its caller, and reads
-- and writes the table as its owner; only the PL/pgSQL functions pin
-- search_path with a SET clause (the C code pins it around its SQL)
SELECT p.oid::regprocedure AS function, p.prosecdef, p.provolatile,
       p.proisstrict, p.proconfig
  FROM pg_proc p WHERE p.pronamespace = 'api'::regnamespace ORDER BY 1;

-- it works from there, called with a schema-qualified name
SET search_path = public;
SELECT outcome FROM api.idem_claim('acme', 'POST /orders', 'k1');
SELECT api.idem_complete('acme', 'POST /orders', 'k1', 200, 'ok');
SELECT outcome, convert_from(body, 'UTF8') AS body FROM api.idem_claim('acme', 'POST /orders', 'k1');

-- completing a claim is a HOT update
BEGIN;
SELECT outcome FROM api.idem_claim('acme', 'POST /orders', 'hot');
SELECT api.idem_complete('acme', 'POST /orders', 'hot', 200, 'hot body');
SELECT pg_stat_get_xact_tuples_updated('api.idem_record'::regclass) >= 1 AS updated,
       pg_stat_get_xact_tuples_hot_updated('api.idem_record'::regclass) =
       pg_stat_get_xact_tuples_updated('api.idem_record'::regclass) AS all_hot;
COMMIT;

-- a replay writes nothing and takes no transaction id
BEGIN;
SELECT outcome FROM api.idem_claim('acme', 'POST /orders', 'hot');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- a small table, as a purge leaves it, is still searched through its
-- indexes: a new backend plans the statements of the SQL way (the listing,
-- the purge, idem_forget's deletion) at its first call, here while the
-- statistics say the table has a page and a few rows, where a sequential
-- scan would be the cheaper plan, and must not keep sequential scans as the
-- table fills.  Claims and finishes reach the table directly, with no plan
-- at all.
TRUNCATE api.idem_record;
SELECT count(*) FROM generate_series(1, 3) i, api.idem_claim('acme', 'POST /few', 'k' || i) c;
ANALYZE api.idem_record;
\c
SELECT count(*) FROM api.idem_list('acme');
BEGIN;
SELECT count(*) FROM generate_series(1, 50) i, api.idem_claim('acme', 'POST /plan', 'k' || i) c;
SELECT count(*) FROM generate_series(1, 50) i, api.idem_complete('acme', 'POST /plan', 'k' || i, 200, 'x'::bytea) c;
SELECT count(*) FROM api.idem_list('acme', 'POST /plan');
SELECT api.idem_purge() AS purged;
SELECT count(*) FILTER (WHERE api.idem_forget('acme', 'POST /plan', 'k' || i)) AS forgotten
  FROM generate_series(1, 50) i;
SELECT pg_stat_get_xact_numscans('api.idem_record'::regclass) AS sequential_scans;
COMMIT;

-- dropping and creating the extension again, elsewhere, in one session
DROP EXTENSION idem;
CREATE EXTENSION idem SCHEMA public;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'k1');
DROP EXTENSION idem;
DROP SCHEMA api;
