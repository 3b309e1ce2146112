/* idem--0.3.0--0.4.0.sql: upgrade idem 0.3.0 to 0.4.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.0'" to load this file. \quit

/*
 * The strongest lock this update takes on the tables that calls use, taken
 * first: a call that read a table before the update began then waits for
 * the update, instead of holding its read lock while it waits for a weaker
 * lock the update took earlier, a deadlock (test/t/062_rolling_upgrade.pl
 * met it: a claim against the ALTER TABLE below, after the CREATE INDEX).
 */
LOCK TABLE idem_record, idem_outbox IN ACCESS EXCLUSIVE MODE;

COMMENT ON COLUMN idem_outbox.expires_at IS
	'when a finished message is purged; before it finishes, created_at plus the retention its enqueue fixed';

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

/* idem_stats counts the claims answered frozen (0.4.0) */
DROP VIEW idem_stats;
DROP FUNCTION idem_stats_read();

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

REVOKE ALL ON FUNCTION idem_stats_read() FROM PUBLIC;
REVOKE ALL ON idem_stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats_read() TO pg_monitor;
GRANT SELECT ON idem_stats TO pg_monitor;

COMMENT ON VIEW idem_stats IS
	'what idem did per database since the server started or idem_stats_reset()';
COMMENT ON FUNCTION idem_claim(text, text, text, bytea, boolean, interval, interval, interval) IS
	'claim a key before executing a request: claimed, replay, in_progress, mismatch, unknown or frozen';

/*
 * Trace ids (0.4.0): idem.trace of the claim that executed and of the
 * enqueue, shown by idem_list and idem_message
 */
ALTER TABLE idem_record ADD COLUMN trace text;
ALTER TABLE idem_outbox ADD COLUMN trace text;
COMMENT ON COLUMN idem_record.trace IS
	'idem.trace of the claim that executed (the request''s trace id)';
COMMENT ON COLUMN idem_outbox.trace IS
	'idem.trace of the enqueue (the trace id of the request that made the message)';

DROP FUNCTION idem_list(text, text, boolean, integer);
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
REVOKE ALL ON FUNCTION idem_list(text, text, boolean, integer) FROM PUBLIC;
COMMENT ON FUNCTION idem_list(text, text, boolean, integer) IS
	'operator listing of one tenant''s records, bodies only if asked';

DROP FUNCTION idem_message(text, text, text);
CREATE FUNCTION idem_message(tenant text, topic text, key text)
RETURNS TABLE (id bigint, state text, attempt integer,
			   not_before timestamptz, last_error text, status integer,
			   body bytea, created_at timestamptz, finished_at timestamptz,
			   expires_at timestamptz, trace text)
AS 'MODULE_PATHNAME', 'idem_message'
LANGUAGE C STABLE ROWS 1;
COMMENT ON FUNCTION idem_message(text, text, text) IS
	'the poll: a message''s state and the receiver''s answer';
