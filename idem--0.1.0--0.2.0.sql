/* idem--0.1.0--0.2.0.sql: upgrade idem 0.1.0 to 0.2.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

/* issue 14: Citus */

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
		'idem_fail', 'idem_replay', 'idem_release', 'idem_forget', 'idem_list'];
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
		-- the records move into the shards; the shell keeps no copy
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
