/* idem--0.3.0--0.4.0.sql: upgrade idem 0.3.0 to 0.4.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.0'" to load this file. \quit

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
									statuses integer[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_delivered_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION idem_enqueue_many(text, text, text[], bytea[], jsonb[]) IS
	'in the caller''s transaction: idem_enqueue of each element, a row per element';
COMMENT ON FUNCTION idem_enqueue_many(text, text, text[], jsonb[], jsonb[]) IS
	'in the caller''s transaction: idem_enqueue of each element, a row per element';
COMMENT ON FUNCTION idem_delivered_many(bigint[], integer[], integer[]) IS
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
