/* idem--0.2.0--0.3.0.sql: upgrade idem 0.2.0 to 0.3.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit

/*
 * The strongest lock this update takes on the tables that calls use, taken
 * first: a call that read a table before the update began then waits for
 * the update, instead of holding its read lock while it waits for a weaker
 * lock the update took earlier, a deadlock (test/t/062_rolling_upgrade.pl
 * met it, updating 0.2.0 to 0.4.0 while claims ran).
 */
LOCK TABLE idem_binding, idem_record IN ACCESS EXCLUSIVE MODE;

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

/* issue 23: the outbox */

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
	CONSTRAINT idem_outbox_pkey PRIMARY KEY (id)
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
			   expires_at timestamptz)
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
 * Parallel labels.  The counters read nothing a parallel worker lacks:
 * PARALLEL SAFE, as the idem_role type's I/O functions above.  Every other
 * function stays PARALLEL UNSAFE: the tenant binding is read with the
 * latest snapshot, which parallel mode forbids, and every call but the
 * counters' checks it.
 */
ALTER FUNCTION idem_stats_read() PARALLEL SAFE;
