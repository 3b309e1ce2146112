/* idem--0.2.0--0.3.0.sql: upgrade idem 0.2.0 to 0.3.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit

/*
 * The tenant binding's cache invalidation and the fencing floor rest on
 * statement triggers, which a session with session_replication_role =
 * replica (a migration tool, a restore) did not fire: enabled ALWAYS, they
 * fire whatever a session sets.
 */
ALTER TABLE idem_binding ENABLE ALWAYS TRIGGER idem_binding_changed;
ALTER TABLE idem_record ENABLE ALWAYS TRIGGER idem_record_forgotten;

/*
 * issue 26: a restore into a cluster that lacks a bound role restores the
 * other bindings.  The role column's values stay the same OIDs.
 */
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
LANGUAGE C STRICT STABLE;

CREATE FUNCTION idem_role_out(idem_role)
RETURNS cstring
AS 'MODULE_PATHNAME', 'idem_role_out'
LANGUAGE C STRICT STABLE;

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

ALTER TABLE idem_binding ALTER COLUMN role TYPE idem_role;

CREATE FUNCTION idem_binding_unknown_role()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_binding_unknown_role'
LANGUAGE C;

REVOKE ALL ON FUNCTION idem_binding_unknown_role() FROM PUBLIC;

CREATE TRIGGER idem_binding_unknown_role
	BEFORE INSERT OR UPDATE ON idem_binding
	FOR EACH ROW EXECUTE FUNCTION idem_binding_unknown_role();

ALTER TABLE idem_binding ENABLE ALWAYS TRIGGER idem_binding_unknown_role;

/* issue 24: batches */

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

/*
 * idem_distribute() delegates the batch functions by tenant too, like the
 * single ones.  Call it again after the update on a Citus coordinator.
 */
CREATE OR REPLACE FUNCTION idem_distribute()
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
