/* idem--0.4.0.sql: the record table and the SQL-callable API of idem */

\echo Use "CREATE EXTENSION idem" to load this file. \quit

/*
 * One row per (tenant, endpoint, key).  The key columns use the "C"
 * collation: equality is then plain byte comparison, which is both what an
 * idempotency key means and immune to collation-library upgrades.  The
 * fillfactor leaves room on each page so that finishing a claim, which
 * changes no indexed column, is a HOT update.
 */
CREATE TABLE idem_record (
	tenant				text COLLATE "C" NOT NULL,
	endpoint			text COLLATE "C" NOT NULL,
	key					text COLLATE "C" NOT NULL,
	state				text NOT NULL
		CHECK (state IN ('pending', 'succeeded', 'failed')),
	retryable			boolean NOT NULL DEFAULT false,
	fingerprint			bytea CHECK (octet_length(fingerprint) = 32),
	status				integer CHECK (status BETWEEN 100 AND 599),
	body				bytea,
	attempt				integer NOT NULL CHECK (attempt >= 1),
	created_at			timestamptz NOT NULL,
	claimed_at			timestamptz NOT NULL,
	lease_expires_at	timestamptz NOT NULL,
	finished_at			timestamptz,
	expires_at			timestamptz NOT NULL,
	headers				jsonb CHECK (jsonb_typeof(headers) = 'object'),
	trace				text
) WITH (fillfactor = 70);

CREATE UNIQUE INDEX idem_record_key ON idem_record (tenant, endpoint, key);
CREATE INDEX idem_record_expires ON idem_record (expires_at);

COMMENT ON TABLE idem_record IS
	'idempotency records: one per tenant, endpoint and key';
COMMENT ON COLUMN idem_record.state IS
	'pending (claimed, not finished), succeeded or failed';
COMMENT ON COLUMN idem_record.retryable IS
	'for a failed record: true when the next claim may execute again (a system error or a release)';
COMMENT ON COLUMN idem_record.fingerprint IS
	'SHA-256 of the request fingerprint given to the first claim';
COMMENT ON COLUMN idem_record.headers IS
	'the response headers to replay, a JSON object of strings or arrays of strings; NULL when none';
COMMENT ON COLUMN idem_record.attempt IS
	'the fencing token: one more for each re-claim, above every attempt of the key''s deleted records';
COMMENT ON COLUMN idem_record.lease_expires_at IS
	'when a committed pending claim stops being in_progress and becomes unknown';
COMMENT ON COLUMN idem_record.trace IS
	'idem.trace of the claim that executed (the request''s trace id)';

/* pg_dump keeps the records: they are data, not configuration we recreate */
SELECT pg_catalog.pg_extension_config_dump('idem_record', '');

REVOKE ALL ON idem_record FROM PUBLIC;

/*
 * The role column's type: a role's OID, written as the role's current
 * name, like regrole, so that pg_dump writes names; read back, a name that
 * names no role is a WARNING, not an error, and the row trigger
 * idem_binding_unknown_role skips that binding, so a restore into a
 * cluster that lacks a role restores every other binding.  Compared and
 * indexed as an oid.
 */
CREATE TYPE idem_role;

CREATE FUNCTION idem_role_in(cstring)
RETURNS idem_role
AS 'MODULE_PATHNAME', 'idem_role_in'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

CREATE FUNCTION idem_role_out(idem_role)
RETURNS cstring
AS 'MODULE_PATHNAME', 'idem_role_out'
LANGUAGE C STRICT STABLE PARALLEL SAFE;

CREATE TYPE idem_role (
	INPUT = idem_role_in,
	OUTPUT = idem_role_out,
	INTERNALLENGTH = 4,
	PASSEDBYVALUE,
	ALIGNMENT = int4
);

CREATE CAST (idem_role AS oid) WITHOUT FUNCTION AS IMPLICIT;
CREATE CAST (regrole AS idem_role) WITHOUT FUNCTION AS ASSIGNMENT;
CREATE CAST (idem_role AS regrole) WITHOUT FUNCTION;

/*
 * The tenant bindings: a role listed here, and every role that is a member
 * of it, may touch only its tenant's records (src/tenant.c has the rules).
 * Written by the superuser-only idem_bind() and idem_unbind(); dumped by
 * pg_dump, role names and all, but for bindings of roles dropped since
 * (idem_unbind(oid) removes those); restored, a role that is missing is
 * reported and its binding skipped.
 * Any change, however made, invalidates every backend's cached bindings.
 */
CREATE TABLE idem_binding (
	role				idem_role PRIMARY KEY,
	tenant				text COLLATE "C" NOT NULL
		CHECK (octet_length(tenant) BETWEEN 1 AND 255)
);

COMMENT ON TABLE idem_binding IS
	'tenant bindings: each role may touch only its tenant; change with idem_bind() and idem_unbind()';

SELECT pg_catalog.pg_extension_config_dump('idem_binding',
	'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r'
	' WHERE r.oid OPERATOR(pg_catalog.=) idem_binding.role)');

REVOKE ALL ON idem_binding FROM PUBLIC;

CREATE FUNCTION idem_binding_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_binding_changed'
LANGUAGE C;

REVOKE ALL ON FUNCTION idem_binding_changed() FROM PUBLIC;

CREATE TRIGGER idem_binding_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem_binding
	FOR EACH STATEMENT EXECUTE FUNCTION idem_binding_changed();

/*
 * ALWAYS: the trigger fires in a session with session_replication_role =
 * replica too (a migration tool, a restore), where an ordinary trigger does
 * not.  The C code keeps its cache only while the trigger is so enabled.
 */
ALTER TABLE idem_binding ENABLE ALWAYS TRIGGER idem_binding_changed;

CREATE FUNCTION idem_binding_unknown_role()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_binding_unknown_role'
LANGUAGE C;

REVOKE ALL ON FUNCTION idem_binding_unknown_role() FROM PUBLIC;

CREATE TRIGGER idem_binding_unknown_role
	BEFORE INSERT OR UPDATE ON idem_binding
	FOR EACH ROW EXECUTE FUNCTION idem_binding_unknown_role();

ALTER TABLE idem_binding ENABLE ALWAYS TRIGGER idem_binding_unknown_role;

CREATE FUNCTION idem_bind(role regrole, tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_bind'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_unbind(role regrole)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_unbind'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_bind(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_unbind(regrole) FROM PUBLIC;

CREATE FUNCTION idem_tenant()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_tenant'
LANGUAGE C STABLE;

COMMENT ON FUNCTION idem_bind(regrole, text) IS
	'bind a role to a tenant: it and its members may touch no other (superuser only)';
COMMENT ON FUNCTION idem_unbind(regrole) IS
	'drop a role''s tenant binding; returns whether it had one (superuser only)';
COMMENT ON FUNCTION idem_tenant() IS
	'the tenant this call is bound to, NULL when unbound';

/*
 * The fencing floor: for each of 4096 buckets of keys (by hash of the key),
 * the highest attempt of any record of that bucket that was ever deleted
 * (purged, forgotten, or deleted by hand).  A key's new record starts above
 * its bucket's floor, so a fencing token given out before a purge is never
 * valid again for the same key.  A trigger raises it, whatever deletes.
 */
CREATE TABLE idem_attempt_floor (
	bucket				integer PRIMARY KEY CHECK (bucket BETWEEN 0 AND 4095),
	attempt				integer NOT NULL CHECK (attempt >= 1)
);

COMMENT ON TABLE idem_attempt_floor IS
	'per bucket of keys, the highest attempt of a deleted record: new records start above it';

SELECT pg_catalog.pg_extension_config_dump('idem_attempt_floor', '');

REVOKE ALL ON idem_attempt_floor FROM PUBLIC;

/*
 * The trigger runs as the owner, the one function of the extension that
 * does: a role a DBA granted DELETE on idem_record (which row-level security
 * then lets delete nothing) must not make every DELETE fail on the floor.
 */
CREATE FUNCTION idem_record_forgotten()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
BEGIN
	-- in bucket order, so that two deleting transactions never deadlock
	INSERT INTO idem_attempt_floor AS f (bucket, attempt)
		SELECT hashtext(forgotten.key) & 4095, max(forgotten.attempt)
		  FROM forgotten GROUP BY 1 ORDER BY 1
	ON CONFLICT (bucket) DO UPDATE SET attempt = excluded.attempt
		WHERE f.attempt < excluded.attempt;
	RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION idem_record_forgotten() FROM PUBLIC;

CREATE TRIGGER idem_record_forgotten AFTER DELETE ON idem_record
	REFERENCING OLD TABLE AS forgotten
	FOR EACH STATEMENT EXECUTE FUNCTION idem_record_forgotten();

/*
 * ALWAYS, so that no session setting switches the floor off: a DELETE in a
 * session with session_replication_role = replica raises it too.
 */
ALTER TABLE idem_record ENABLE ALWAYS TRIGGER idem_record_forgotten;

/*
 * Row-level security from the same bindings: a bound role that a DBA
 * grants SELECT on the table still sees only its tenant's rows (the
 * binding comes from the backend's cache; no subquery, which Citus refuses
 * in a policy of a distributed table), and, with no policy for writes, can
 * change none even if granted.  The API functions check the binding
 * themselves and read and write the table as its owner, whom row-level
 * security does not restrict.
 */
ALTER TABLE idem_record ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_record_tenant ON idem_record FOR SELECT
	USING (tenant OPERATOR(pg_catalog.=)
		   coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C");

/*
 * The API.  Every function runs as its caller, so that the tenant binding
 * sees who calls; the C code reads and writes idem_record as its owner, who
 * alone may touch it.  None is SECURITY DEFINER, and none has a SET clause:
 * most calls run no SQL (the table is read and written directly), and the
 * statements the C code does run name every object and operator with its
 * schema and run under a search_path that the C code pins for them
 * (pg_catalog, this schema, pg_temp).
 */
CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint bytea DEFAULT NULL,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   retention interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint text,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   retention interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim_text'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint jsonb,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   retention interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body bytea,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body text,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body jsonb,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body bytea,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body text,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body jsonb,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint bytea DEFAULT NULL,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT headers jsonb,
							OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay'
LANGUAGE C STABLE ROWS 1;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint text,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT headers jsonb,
							OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay_text'
LANGUAGE C STABLE ROWS 1;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint jsonb,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT headers jsonb,
							OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay_jsonb'
LANGUAGE C STABLE ROWS 1;

CREATE FUNCTION idem_release(tenant text, endpoint text, key text,
							 attempt integer DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_purge()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_purge() FROM PUBLIC;

/* Operator tools: not for PUBLIC; both honour the tenant binding */
CREATE FUNCTION idem_list(tenant text, endpoint text DEFAULT NULL,
						  with_body boolean DEFAULT false,
						  max_rows integer DEFAULT 100)
RETURNS TABLE (endpoint text, key text, state text, retryable boolean,
			   status integer, attempt integer, created_at timestamptz,
			   claimed_at timestamptz, lease_expires_at timestamptz,
			   finished_at timestamptz, expires_at timestamptz, body bytea,
			   headers jsonb, trace text)
AS 'MODULE_PATHNAME', 'idem_list'
LANGUAGE C STABLE;

CREATE FUNCTION idem_forget(tenant text, endpoint text, key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_forget'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_list(text, text, boolean, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_forget(text, text, text) FROM PUBLIC;

/*
 * Counters of what idem did, per database, kept in shared memory since the
 * server started or idem_stats_reset() was called.  They need idem in
 * shared_preload_libraries; without it, reading them is an error that says
 * so.  Readable by pg_monitor.
 */
CREATE FUNCTION idem_stats_read(OUT datid oid,
								OUT claims_claimed bigint,
								OUT claims_replay bigint,
								OUT claims_in_progress bigint,
								OUT claims_mismatch bigint,
								OUT claims_unknown bigint,
								OUT completes bigint,
								OUT fails bigint,
								OUT fails_retryable bigint,
								OUT releases bigint,
								OUT purged bigint,
								OUT last_purge timestamptz,
								OUT last_purge_ms double precision,
								OUT stats_reset timestamptz,
								OUT claims_frozen bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stats AS
	SELECT s.datid, d.datname,
		   s.claims_claimed, s.claims_replay, s.claims_in_progress,
		   s.claims_mismatch, s.claims_unknown,
		   s.completes, s.fails, s.fails_retryable, s.releases,
		   s.purged, s.last_purge, s.last_purge_ms, s.stats_reset,
		   s.claims_frozen
	  FROM idem_stats_read() s
	  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.datid;

CREATE FUNCTION idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_stats_read() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON idem_stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats_read() TO pg_monitor;
GRANT SELECT ON idem_stats TO pg_monitor;

COMMENT ON FUNCTION idem_claim(text, text, text, bytea, boolean, interval, interval, interval) IS
	'claim a key before executing a request: claimed, replay, in_progress, mismatch, unknown or frozen';
COMMENT ON FUNCTION idem_complete(text, text, text, integer, bytea, integer, jsonb) IS
	'finish a pending claim with the response to replay';
COMMENT ON FUNCTION idem_fail(text, text, text, integer, bytea, boolean, integer, jsonb) IS
	'finish a pending claim as failed: replayed, or re-executable when retryable';
COMMENT ON FUNCTION idem_replay(text, text, text, bytea) IS
	'read-only look-up of what a claim would answer, without claiming';
COMMENT ON FUNCTION idem_release(text, text, text, integer) IS
	'drop a pending claim so that the next claim executes again';
COMMENT ON FUNCTION idem_purge() IS
	'delete expired records now; returns how many';
COMMENT ON FUNCTION idem_list(text, text, boolean, integer) IS
	'operator listing of one tenant''s records, bodies only if asked';
COMMENT ON FUNCTION idem_forget(text, text, text) IS
	'operator tool: delete one key''s record whatever its state';
COMMENT ON VIEW idem_stats IS
	'what idem did per database since the server started or idem_stats_reset()';
COMMENT ON FUNCTION idem_stats_reset() IS
	'zero the idem_stats counters of every database';

/* ---- Citus ---- */

/*
 * The unique key identifies a row for logical replication: UPDATEs and
 * DELETEs of idem_record can be published, and Citus moves its shards
 * online (citus_move_shard_placement, the rebalancer) instead of blocking
 * writes for the length of the copy.
 */
ALTER TABLE idem_record REPLICA IDENTITY USING INDEX idem_record_key;

/*
 * idem_distribute(): on the Citus coordinator, distribute idem_record by
 * tenant and hand every per-key function to Citus, co-located with it and
 * with force_delegation, so that a call (and the rest of its transaction)
 * runs on the node that holds the tenant's shard: the claim, its key lock,
 * its row and the caller's business rows of that tenant all on one node,
 * under one connection.  The functions are the extension's functions of the
 * names in per_key_functions, every signature: a change of arguments needs
 * no change here.  Safe to call again, e.g. after ALTER EXTENSION idem
 * UPDATE, which may replace functions.  Citus must be installed; written in
 * PL/pgSQL because it only calls Citus's own SQL functions.
 */
CREATE FUNCTION idem_distribute()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	per_key_functions CONSTANT name[] := ARRAY['idem_claim', 'idem_complete',
		'idem_fail', 'idem_replay', 'idem_release', 'idem_forget', 'idem_list',
		'idem_claim_many', 'idem_complete_many', 'idem_fail_many'];
	records regclass;
	fn regprocedure;
BEGIN
	IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user) THEN
		RAISE EXCEPTION 'permission denied for function idem_distribute'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'Only a superuser may distribute idem''s records.';
	END IF;
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
		RAISE EXCEPTION 'extension "citus" is not installed in database "%"',
			current_database()
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Put citus first in shared_preload_libraries on every node, run CREATE EXTENSION citus and add the worker nodes, then call idem_distribute() again.';
	END IF;
	IF NOT citus_is_coordinator() THEN
		RAISE EXCEPTION 'idem_distribute() must run on the Citus coordinator'
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;

	SELECT format('%s.idem_record', e.extnamespace::regnamespace)::regclass
	  INTO records
	  FROM pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
	IF NOT EXISTS (SELECT FROM pg_dist_partition
				    WHERE logicalrelid OPERATOR(pg_catalog.=) records) THEN
		-- the records move into the shards; the shell keeps no copy.  The
		-- fencing floor's trigger goes with them to every shard, where it
		-- raises the floor of the node that holds the shard (Citus calls a
		-- trigger on a distributed table unsafe, and asks for consent).
		PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
		PERFORM create_distributed_table(records, 'tenant');
		PERFORM truncate_local_data_after_distributing_table(records);
	END IF;

	FOR fn IN
		SELECT p.oid::regprocedure
		  FROM pg_proc p
		  JOIN pg_depend d
			ON d.classid OPERATOR(pg_catalog.=) 'pg_proc'::regclass
		   AND d.objid OPERATOR(pg_catalog.=) p.oid
		   AND d.deptype OPERATOR(pg_catalog.=) 'e'
		   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_extension'::regclass
		   AND d.refobjid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_extension
								   WHERE extname OPERATOR(pg_catalog.=) 'idem')
		 WHERE p.proname OPERATOR(pg_catalog.=) ANY (per_key_functions)
		 ORDER BY p.oid::regprocedure::text
	LOOP
		PERFORM create_distributed_function(fn, '$1',
											colocate_with => records::text,
											force_delegation => true);
	END LOOP;
END
$$;

REVOKE ALL ON FUNCTION idem_distribute() FROM PUBLIC;

/*
 * idem_stats of every node of a Citus cluster, for this database: one row
 * per node (run_command_on_all_nodes), and the sum over the nodes.  A node
 * that cannot answer makes the call fail, naming it.
 */
CREATE FUNCTION idem_stats_nodes(OUT nodeid integer, OUT datid oid,
								 OUT datname name,
								 OUT claims_claimed bigint,
								 OUT claims_replay bigint,
								 OUT claims_in_progress bigint,
								 OUT claims_mismatch bigint,
								 OUT claims_unknown bigint,
								 OUT completes bigint, OUT fails bigint,
								 OUT fails_retryable bigint,
								 OUT releases bigint, OUT purged bigint,
								 OUT last_purge timestamptz,
								 OUT last_purge_ms double precision,
								 OUT stats_reset timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	stats text;
	answer record;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
		RAISE EXCEPTION 'extension "citus" is not installed in database "%"',
			current_database()
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Without Citus, read idem_stats.';
	END IF;
	SELECT format('%s.idem_stats', e.extnamespace::regnamespace) INTO stats
	  FROM pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
	FOR answer IN
		SELECT * FROM run_command_on_all_nodes(format(
			'SELECT pg_catalog.json_agg(s) FROM %s s'
			' WHERE s.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()',
			stats))
	LOOP
		IF NOT answer.success THEN
			RAISE EXCEPTION 'could not read idem_stats on Citus node %', answer.nodeid
				USING ERRCODE = 'connection_failure',
					  DETAIL = format('The node answered: %s', answer.result);
		END IF;
		RETURN QUERY EXECUTE format(
			'SELECT $1, s.datid, s.datname, s.claims_claimed, s.claims_replay,'
			' s.claims_in_progress, s.claims_mismatch, s.claims_unknown,'
			' s.completes, s.fails, s.fails_retryable, s.releases, s.purged,'
			' s.last_purge, s.last_purge_ms, s.stats_reset'
			' FROM pg_catalog.json_populate_recordset(NULL::%s, $2::pg_catalog.json) s',
			stats)
			USING answer.nodeid, answer.result;
	END LOOP;
END
$$;

CREATE VIEW idem_stats_cluster AS
	SELECT pg_catalog.count(*)::integer AS nodes,
		   pg_catalog.sum(claims_claimed)::bigint AS claims_claimed,
		   pg_catalog.sum(claims_replay)::bigint AS claims_replay,
		   pg_catalog.sum(claims_in_progress)::bigint AS claims_in_progress,
		   pg_catalog.sum(claims_mismatch)::bigint AS claims_mismatch,
		   pg_catalog.sum(claims_unknown)::bigint AS claims_unknown,
		   pg_catalog.sum(completes)::bigint AS completes,
		   pg_catalog.sum(fails)::bigint AS fails,
		   pg_catalog.sum(fails_retryable)::bigint AS fails_retryable,
		   pg_catalog.sum(releases)::bigint AS releases,
		   pg_catalog.sum(purged)::bigint AS purged,
		   pg_catalog.max(last_purge) AS last_purge
	  FROM idem_stats_nodes();

REVOKE ALL ON FUNCTION idem_stats_nodes() FROM PUBLIC;
REVOKE ALL ON idem_stats_cluster FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats_nodes() TO pg_monitor;
GRANT SELECT ON idem_stats_cluster TO pg_monitor;

COMMENT ON FUNCTION idem_distribute() IS
	'on the Citus coordinator: distribute idem_record by tenant and delegate the per-key functions to its shards';
COMMENT ON FUNCTION idem_stats_nodes() IS
	'on Citus: idem_stats of this database on every node';
COMMENT ON VIEW idem_stats_cluster IS
	'on Citus: idem_stats of this database summed over every node';

/* ---- Batches of claims and finishes ---- */

/*
 * A batch consumer's claims and finishes, one call per batch: every element
 * is what the single call would answer or do, called once per element in
 * the order of the arrays (a key repeated in keys is, at its second
 * occurrence, this transaction's own claim: in_progress).  A batch never
 * waits.  Element-wise arrays must be as long as keys, or NULL for none;
 * bad input anywhere in them is refused before anything is written.
 */
CREATE FUNCTION idem_claim_many(tenant text, endpoint text, keys text[],
								fingerprints bytea[] DEFAULT NULL,
								lease interval DEFAULT NULL,
								retention interval DEFAULT NULL)
RETURNS TABLE (key text, outcome text, status integer, body bytea,
			   headers jsonb, attempt integer, created_at timestamptz,
			   expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_claim_many'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_claim_many(tenant text, endpoint text, keys text[],
								fingerprints text[],
								lease interval DEFAULT NULL,
								retention interval DEFAULT NULL)
RETURNS TABLE (key text, outcome text, status integer, body bytea,
			   headers jsonb, attempt integer, created_at timestamptz,
			   expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_claim_many_text'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_claim_many(tenant text, endpoint text, keys text[],
								fingerprints jsonb[],
								lease interval DEFAULT NULL,
								retention interval DEFAULT NULL)
RETURNS TABLE (key text, outcome text, status integer, body bytea,
			   headers jsonb, attempt integer, created_at timestamptz,
			   expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_claim_many_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_complete_many(tenant text, endpoint text, keys text[],
								   statuses integer[], bodies bytea[],
								   attempts integer[] DEFAULT NULL,
								   headers jsonb[] DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_complete_many'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_fail_many(tenant text, endpoint text, keys text[],
							   statuses integer[], bodies bytea[],
							   retryable boolean DEFAULT false,
							   attempts integer[] DEFAULT NULL,
							   headers jsonb[] DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_fail_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idem_claim_many(text, text, text[], bytea[], interval, interval) IS
	'claim a batch of keys: one row per key, in order, each what idem_claim would answer';
COMMENT ON FUNCTION idem_complete_many(text, text, text[], integer[], bytea[], integer[], jsonb[]) IS
	'finish a batch of pending claims with their responses; returns how many';
COMMENT ON FUNCTION idem_fail_many(text, text, text[], integer[], bytea[], boolean, integer[], jsonb[]) IS
	'finish a batch of pending claims as failed; returns how many';

/* ---- The outbox ---- */

/*
 * One row per (tenant, topic, key): an outbound message that a business
 * transaction wrote, and what became of it.  The key columns use "C" as
 * idem_record's do.  state is queued (due from not_before on), leased
 * (taken by a dispatcher until lease_expires_at; not_before is then the
 * lease's end, when the message is due again), delivered, dead, or unknown
 * (a message with redeliver = false whose lease ran out: an operator
 * decides).  attempt is the latest take's fencing token, 0 before the
 * first; attempt_base is where the attempts of the current run started (0,
 * or the attempt at the last idem_requeue), so that a message dies after
 * max_attempts takes of one run.  The ids come from idem_outbox_id_seq,
 * which the C code calls itself: nothing inserts rows by SQL.
 */
CREATE SEQUENCE idem_outbox_id_seq AS bigint;

CREATE TABLE idem_outbox (
	id					bigint NOT NULL,
	tenant				text COLLATE "C" NOT NULL,
	topic				text COLLATE "C" NOT NULL,
	key					text COLLATE "C" NOT NULL,
	state				text NOT NULL
		CHECK (state IN ('queued', 'leased', 'delivered', 'dead', 'unknown')),
	payload				bytea NOT NULL,
	headers				jsonb CHECK (jsonb_typeof(headers) = 'object'),
	ordering_key		text COLLATE "C",
	redeliver			boolean NOT NULL,
	max_attempts		integer NOT NULL CHECK (max_attempts >= 1),
	attempt				integer NOT NULL CHECK (attempt >= 0),
	attempt_base		integer NOT NULL CHECK (attempt_base >= 0),
	not_before			timestamptz NOT NULL,
	lease_expires_at	timestamptz,
	last_error			text,
	status				integer CHECK (status BETWEEN 100 AND 599),
	body				bytea,
	created_at			timestamptz NOT NULL,
	finished_at			timestamptz,
	expires_at			timestamptz,
	CONSTRAINT idem_outbox_pkey PRIMARY KEY (id),
	trace				text
);

ALTER SEQUENCE idem_outbox_id_seq OWNED BY idem_outbox.id;

CREATE UNIQUE INDEX idem_outbox_key ON idem_outbox (tenant, topic, key);
/* what idem_take scans: the topic's messages that may be due, oldest first */
CREATE INDEX idem_outbox_due ON idem_outbox (topic, not_before, id)
	WHERE state IN ('queued', 'leased');
/* the messages that hold back later ones of their ordering key */
CREATE INDEX idem_outbox_order ON idem_outbox (tenant, topic, ordering_key, id)
	WHERE ordering_key IS NOT NULL AND state IN ('queued', 'leased', 'unknown');
/* what the purge deletes */
CREATE INDEX idem_outbox_expires ON idem_outbox (expires_at)
	WHERE state IN ('delivered', 'dead');

COMMENT ON TABLE idem_outbox IS
	'outbound messages: one per tenant, topic and key, delivered by a dispatcher';
COMMENT ON COLUMN idem_outbox.state IS
	'queued, leased (taken by a dispatcher), delivered, dead, or unknown (a lease of a message that may not be redelivered ran out)';
COMMENT ON COLUMN idem_outbox.attempt IS
	'the latest take''s fencing token: 1 for the first take, one more for each';
COMMENT ON COLUMN idem_outbox.not_before IS
	'when the message is due: for a leased message, when its lease runs out';
COMMENT ON COLUMN idem_outbox.trace IS
	'idem.trace of the enqueue (the trace id of the request that made the message)';
COMMENT ON COLUMN idem_outbox.expires_at IS
	'when a finished message is purged; before it finishes, created_at plus the retention its enqueue fixed';

SELECT pg_catalog.pg_extension_config_dump('idem_outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idem_outbox_id_seq', '');

REVOKE ALL ON idem_outbox FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem_outbox_id_seq FROM PUBLIC;

/* the tenant binding, as for idem_record */
ALTER TABLE idem_outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_outbox_tenant ON idem_outbox FOR SELECT
	USING (tenant OPERATOR(pg_catalog.=)
		   coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C");

CREATE FUNCTION idem_enqueue(tenant text, topic text, key text,
							 payload bytea,
							 headers jsonb DEFAULT NULL,
							 not_before timestamptz DEFAULT NULL,
							 ordering_key text DEFAULT NULL,
							 max_attempts integer DEFAULT NULL,
							 redeliver boolean DEFAULT true,
							 OUT outcome text, OUT id bigint,
							 OUT state text, OUT created_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_enqueue'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_enqueue(tenant text, topic text, key text,
							 payload text,
							 headers jsonb DEFAULT NULL,
							 not_before timestamptz DEFAULT NULL,
							 ordering_key text DEFAULT NULL,
							 max_attempts integer DEFAULT NULL,
							 redeliver boolean DEFAULT true,
							 OUT outcome text, OUT id bigint,
							 OUT state text, OUT created_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_enqueue'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_enqueue(tenant text, topic text, key text,
							 payload jsonb,
							 headers jsonb DEFAULT NULL,
							 not_before timestamptz DEFAULT NULL,
							 ordering_key text DEFAULT NULL,
							 max_attempts integer DEFAULT NULL,
							 redeliver boolean DEFAULT true,
							 OUT outcome text, OUT id bigint,
							 OUT state text, OUT created_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_enqueue_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_take(topic text, max_messages integer DEFAULT 1,
						  lease interval DEFAULT NULL,
						  tenant text DEFAULT NULL)
RETURNS TABLE (id bigint, tenant text, topic text, key text, payload bytea,
			   headers jsonb, attempt integer,
			   lease_expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_take'
LANGUAGE C VOLATILE ROWS 10;

CREATE FUNCTION idem_delivered(id bigint, attempt integer,
							   status integer DEFAULT NULL,
							   body bytea DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_delivered'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_retry(id bigint, attempt integer,
						   error text DEFAULT NULL,
						   after interval DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_retry'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_dead(id bigint, attempt integer,
						  error text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_dead'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_requeue(id bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_requeue'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_requeue(bigint) FROM PUBLIC;

CREATE FUNCTION idem_message(tenant text, topic text, key text)
RETURNS TABLE (id bigint, state text, attempt integer,
			   not_before timestamptz, last_error text, status integer,
			   body bytea, created_at timestamptz, finished_at timestamptz,
			   expires_at timestamptz, trace text)
AS 'MODULE_PATHNAME', 'idem_message'
LANGUAGE C STABLE ROWS 1;

/*
 * Per topic: the messages in each state (a leased message whose lease ran
 * out counts as the next take will leave it: unknown when it may not be
 * redelivered, dead when its attempts are used up, else queued),
 * how long the oldest due message has waited, and what the messages the
 * table holds went through: deliveries, deaths, and retries (the takes
 * that did not end in a delivery or a death and are not the live lease).
 * Counted from the table, so over the messages that idem.outbox_retention
 * keeps.  The view reads the table as its owner (pg_monitor may read the
 * view, not the payloads), and shows a bound role its own tenant's
 * messages only.
 */
CREATE VIEW idem_outbox_stats AS
SELECT topic,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'queued') AS queued,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'leased') AS leased,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'unknown') AS unknown,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'delivered') AS delivered,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'dead') AS dead,
	   pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-)
		   min(not_before) FILTER (WHERE s OPERATOR(pg_catalog.=) 'queued'
		   AND not_before OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp())
		   AS oldest_due_age,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'delivered') AS deliveries,
	   (coalesce(sum(attempt), 0) OPERATOR(pg_catalog.-)
		   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=)
		   ANY (ARRAY['leased', 'delivered', 'dead'])
		   AND attempt OPERATOR(pg_catalog.>) 0))::bigint
		   AS retries,
	   count(*) FILTER (WHERE s OPERATOR(pg_catalog.=) 'dead') AS deaths
FROM (SELECT topic, attempt, not_before,
			 CASE WHEN state OPERATOR(pg_catalog.=) 'leased'
			  AND lease_expires_at OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp()
			 THEN CASE WHEN NOT redeliver THEN 'unknown'
					   WHEN attempt OPERATOR(pg_catalog.-) attempt_base
						  OPERATOR(pg_catalog.>=) max_attempts THEN 'dead'
					   ELSE 'queued' END
			 ELSE state END AS s
	  FROM @extschema@.idem_outbox
	  WHERE tenant OPERATOR(pg_catalog.=)
			coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C") m
GROUP BY topic;

REVOKE ALL ON idem_outbox_stats FROM PUBLIC;
GRANT SELECT ON idem_outbox_stats TO pg_monitor;

COMMENT ON FUNCTION idem_enqueue(text, text, text, bytea, jsonb, timestamptz, text, integer, boolean) IS
	'in the caller''s transaction: write an outbound message (enqueued, duplicate or mismatch)';
COMMENT ON FUNCTION idem_take(text, integer, interval, text) IS
	'lease up to max_messages due messages of a topic, skipping those another transaction holds';
COMMENT ON FUNCTION idem_delivered(bigint, integer, integer, bytea) IS
	'a leased (or unknown) message was delivered: store the receiver''s answer';
COMMENT ON FUNCTION idem_retry(bigint, integer, text, interval) IS
	'a delivery failed: due again after the backoff, or dead after max_attempts; returns the new state';
COMMENT ON FUNCTION idem_dead(bigint, integer, text) IS
	'a delivery failed for good: the message is dead';
COMMENT ON FUNCTION idem_requeue(bigint) IS
	'operator tool: a dead or unknown message is queued again, due now';
COMMENT ON FUNCTION idem_message(text, text, text) IS
	'the poll: a message''s state and the receiver''s answer';
COMMENT ON VIEW idem_outbox_stats IS
	'per topic: messages in each state, the oldest due message''s age, deliveries, retries and deaths';

/*
 * Budgets (0.4.0): one retry budget per task, spent by every layer that
 * retries it.  A spend is an UPDATE whose WHERE clause holds the total, so
 * the row lock decides between concurrent spends and a rolled-back spend is
 * not spent.  Purged like records once expired.
 */
CREATE TABLE idem_budget (
	tenant				text COLLATE "C" NOT NULL,
	task				text COLLATE "C" NOT NULL,
	total				integer NOT NULL CHECK (total >= 1),
	spent				integer NOT NULL CHECK (spent >= 0 AND spent <= total),
	created_at			timestamptz NOT NULL,
	expires_at			timestamptz NOT NULL,
	CONSTRAINT idem_budget_pkey PRIMARY KEY (tenant, task)
);

CREATE INDEX idem_budget_expires ON idem_budget (expires_at);

COMMENT ON TABLE idem_budget IS
	'retry budgets: per tenant and task, how many attempts every layer may spend';

SELECT pg_catalog.pg_extension_config_dump('idem_budget', '');

REVOKE ALL ON idem_budget FROM PUBLIC;

/* the tenant binding, as for idem_record */
ALTER TABLE idem_budget ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_budget_tenant ON idem_budget FOR SELECT
	USING (tenant OPERATOR(pg_catalog.=)
		   coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C");

CREATE FUNCTION idem_budget(tenant text, task text, attempts integer,
							ttl interval DEFAULT '1 day')
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_budget'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_spend(tenant text, task text, n integer DEFAULT 1)
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_spend'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idem_budget(text, text, integer, interval) IS
	'create a task''s retry budget of attempts (or answer the existing one); returns what is left';
COMMENT ON FUNCTION idem_spend(text, text, integer) IS
	'in the caller''s transaction: spend n attempts of a task''s budget; returns what is left, errors IB001 when it cannot';

/*
 * Batches of the outbox (0.4.0): an enqueue per element in one call, and
 * the deliveries of a take's leases in one call
 */
CREATE FUNCTION idem_enqueue_many(tenant text, topic text, keys text[],
								  payloads bytea[],
								  headers jsonb[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text, id bigint, state text,
			   created_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_enqueue_many'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_enqueue_many(tenant text, topic text, keys text[],
								  payloads jsonb[],
								  headers jsonb[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text, id bigint, state text,
			   created_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_enqueue_many_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_delivered_many(ids bigint[], attempts integer[],
									statuses integer[] DEFAULT NULL,
									bodies bytea[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_delivered_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idem_enqueue_many(text, text, text[], bytea[], jsonb[]) IS
	'in the caller''s transaction: idem_enqueue of each element, a row per element';
COMMENT ON FUNCTION idem_enqueue_many(text, text, text[], jsonb[], jsonb[]) IS
	'in the caller''s transaction: idem_enqueue of each element, a row per element';
COMMENT ON FUNCTION idem_delivered_many(bigint[], integer[], integer[], bytea[]) IS
	'idem_delivered of each lease of a batch; a stale one anywhere writes nothing of the batch';

/*
 * Seeing duplicates (0.4.0): idem_suspects reads the records first claimed
 * in a window of time, through a BRIN index on created_at, which claims
 * keep cheaply (records are inserted in created_at order)
 */
CREATE INDEX idem_record_created ON idem_record USING brin (created_at);

CREATE FUNCTION idem_suspects(since interval DEFAULT '1 day',
							  within interval DEFAULT '1 minute')
RETURNS TABLE (tenant text, endpoint text, fingerprint bytea, keys text[],
			   first_at timestamptz, last_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_suspects'
LANGUAGE C STABLE;

REVOKE ALL ON FUNCTION idem_suspects(interval, interval) FROM PUBLIC;

COMMENT ON FUNCTION idem_suspects(interval, interval) IS
	'operator tool: one request under several keys (same fingerprint, first claimed within "within" of each other) since "since" ago';

/*
 * Pausing an outbox topic (0.4.0): idem_take leases nothing that a pause
 * holds (a topic, of one tenant or of all: tenant NULL)
 */
CREATE TABLE idem_pause (
	topic				text COLLATE "C" NOT NULL,
	tenant				text COLLATE "C",
	paused_at			timestamptz NOT NULL,
	CONSTRAINT idem_pause_key UNIQUE NULLS NOT DISTINCT (topic, tenant)
);

COMMENT ON TABLE idem_pause IS
	'paused outbox topics (of one tenant, or of all for a NULL tenant): idem_take leases none of their messages';

SELECT pg_catalog.pg_extension_config_dump('idem_pause', '');

REVOKE ALL ON idem_pause FROM PUBLIC;

ALTER TABLE idem_pause ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_pause_tenant ON idem_pause FOR SELECT
	USING (tenant IS NULL OR tenant OPERATOR(pg_catalog.=)
		   coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C");

CREATE FUNCTION idem_pause(topic text, tenant text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_pause'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_resume(topic text, tenant text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_resume'
LANGUAGE C VOLATILE;

REVOKE ALL ON FUNCTION idem_pause(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_resume(text, text) FROM PUBLIC;

COMMENT ON FUNCTION idem_pause(text, text) IS
	'operator tool: no dispatcher takes the topic''s messages (of tenant, or of every tenant) until idem_resume; true if this call paused them';
COMMENT ON FUNCTION idem_resume(text, text) IS
	'operator tool: lift idem_pause; true if there was such a pause';

/*
 * Freezing an entry point (0.4.0): a claim of a frozen (tenant, endpoint)
 * that would execute answers "frozen" and writes nothing (endpoint NULL:
 * every endpoint of the tenant), until idem_thaw or until "until".  Every
 * backend keeps the table's rows in memory; the statement trigger tells
 * them to read it again.
 */
CREATE TABLE idem_freeze (
	tenant				text COLLATE "C" NOT NULL,
	endpoint			text COLLATE "C",
	reason				text,
	until				timestamptz,
	frozen_at			timestamptz NOT NULL,
	CONSTRAINT idem_freeze_key UNIQUE NULLS NOT DISTINCT (tenant, endpoint)
);

COMMENT ON TABLE idem_freeze IS
	'frozen entry points (a tenant''s endpoint, or all its endpoints for a NULL endpoint): a claim that would execute answers frozen';

SELECT pg_catalog.pg_extension_config_dump('idem_freeze', '');

REVOKE ALL ON idem_freeze FROM PUBLIC;

ALTER TABLE idem_freeze ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_freeze_tenant ON idem_freeze FOR SELECT
	USING (tenant OPERATOR(pg_catalog.=)
		   coalesce(@extschema@.idem_tenant(), tenant) COLLATE "C");

CREATE FUNCTION idem_freeze_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_freeze_changed'
LANGUAGE C;

REVOKE ALL ON FUNCTION idem_freeze_changed() FROM PUBLIC;

CREATE TRIGGER idem_freeze_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem_freeze
	FOR EACH STATEMENT EXECUTE FUNCTION idem_freeze_changed();

/* a restore or a replica-role session changes the table too */
ALTER TABLE idem_freeze ENABLE ALWAYS TRIGGER idem_freeze_changed;

CREATE FUNCTION idem_freeze(tenant text, endpoint text,
							reason text DEFAULT NULL,
							until timestamptz DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_freeze'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_thaw(tenant text, endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_thaw'
LANGUAGE C VOLATILE;

CREATE FUNCTION idem_frozen(tenant text, endpoint text)
RETURNS TABLE (reason text, until timestamptz)
AS 'MODULE_PATHNAME', 'idem_frozen'
LANGUAGE C VOLATILE ROWS 1;

REVOKE ALL ON FUNCTION idem_freeze(text, text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_thaw(text, text) FROM PUBLIC;

COMMENT ON FUNCTION idem_freeze(text, text, text, timestamptz) IS
	'operator tool: no claim of the tenant''s endpoint (every endpoint for NULL) executes until idem_thaw or until; true if this call froze it';
COMMENT ON FUNCTION idem_thaw(text, text) IS
	'operator tool: lift idem_freeze; true if there was such a freeze';
COMMENT ON FUNCTION idem_frozen(text, text) IS
	'the freeze that makes a claim of the endpoint answer frozen now (reason, until), or no row';
