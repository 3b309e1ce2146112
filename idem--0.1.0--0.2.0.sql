/* idem--0.1.0--0.2.0.sql: upgrade idem 0.1.0 to 0.2.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

/*
 * issue 15: response headers, and waiting for a committed pending claim.
 * idem_record gets a headers column; idem_complete and idem_fail take
 * headers, idem_claim takes wait_timeout, and idem_claim, idem_replay and
 * idem_list return headers: a changed signature or result row is a new
 * function, so the old ones are dropped and the new ones created as the
 * install script creates them.
 */
ALTER TABLE idem_record
	ADD COLUMN headers jsonb CHECK (jsonb_typeof(headers) = 'object');
COMMENT ON COLUMN idem_record.headers IS
	'the response headers to replay, a JSON object of strings or arrays of strings; NULL when none';

DROP FUNCTION idem_claim(text, text, text, bytea, boolean, interval);
DROP FUNCTION idem_claim(text, text, text, text, boolean, interval);
DROP FUNCTION idem_claim(text, text, text, jsonb, boolean, interval);
DROP FUNCTION idem_complete(text, text, text, integer, bytea, integer);
DROP FUNCTION idem_complete(text, text, text, integer, text, integer);
DROP FUNCTION idem_complete(text, text, text, integer, jsonb, integer);
DROP FUNCTION idem_fail(text, text, text, integer, bytea, boolean, integer);
DROP FUNCTION idem_fail(text, text, text, integer, text, boolean, integer);
DROP FUNCTION idem_fail(text, text, text, integer, jsonb, boolean, integer);
DROP FUNCTION idem_replay(text, text, text);
DROP FUNCTION idem_list(text, text, boolean, integer);

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint bytea DEFAULT NULL,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint text,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint jsonb,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   wait_timeout interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT headers jsonb,
						   OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body bytea,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body text,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_complete(tenant text, endpoint text, key text,
							  status integer, body jsonb,
							  attempt integer DEFAULT NULL,
							  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body bytea,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body text,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_fail(tenant text, endpoint text, key text,
						  status integer, body jsonb,
						  retryable boolean DEFAULT false,
						  attempt integer DEFAULT NULL,
						  headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_fail_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT headers jsonb,
							OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay'
LANGUAGE C STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_list(tenant text, endpoint text DEFAULT NULL,
						  with_body boolean DEFAULT false,
						  max_rows integer DEFAULT 100)
RETURNS TABLE (endpoint text, key text, state text, retryable boolean,
			   status integer, attempt integer, created_at timestamptz,
			   claimed_at timestamptz, lease_expires_at timestamptz,
			   finished_at timestamptz, expires_at timestamptz, body bytea,
			   headers jsonb)
AS 'MODULE_PATHNAME', 'idem_list'
LANGUAGE C STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

REVOKE ALL ON FUNCTION idem_list(text, text, boolean, integer) FROM PUBLIC;

COMMENT ON FUNCTION idem_claim(text, text, text, bytea, boolean, interval, interval) IS
	'claim a key before executing a request: claimed, replay, in_progress, mismatch or unknown';
COMMENT ON FUNCTION idem_complete(text, text, text, integer, bytea, integer, jsonb) IS
	'finish a pending claim with the response to replay';
COMMENT ON FUNCTION idem_fail(text, text, text, integer, bytea, boolean, integer, jsonb) IS
	'finish a pending claim as failed: replayed, or re-executable when retryable';
COMMENT ON FUNCTION idem_replay(text, text, text) IS
	'read-only look-up of what a claim would answer, without claiming';
COMMENT ON FUNCTION idem_list(text, text, boolean, integer) IS
	'operator listing of one tenant''s records, bodies only if asked';
