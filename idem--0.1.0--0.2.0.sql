/* idem--0.1.0--0.2.0.sql: upgrade idem 0.1.0 to 0.2.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

/*
 * issue 11: a fencing floor that deleted records raise; idem_claim takes a
 * retention; idem_replay takes a fingerprint (bytea, text and jsonb) and
 * answers what a claim would; text fingerprints get their own C function
 * (digested over UTF-8).
 */
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

COMMENT ON COLUMN idem_record.attempt IS
	'the fencing token: one more for each re-claim, above every attempt of the key''s deleted records';

DROP FUNCTION idem_claim(text, text, text, bytea, boolean, interval);
DROP FUNCTION idem_claim(text, text, text, text, boolean, interval);
DROP FUNCTION idem_claim(text, text, text, jsonb, boolean, interval);
DROP FUNCTION idem_replay(text, text, text);

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint bytea DEFAULT NULL,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   retention interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT attempt integer,
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
						   retention interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim_text'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_claim(tenant text, endpoint text, key text,
						   fingerprint jsonb,
						   wait boolean DEFAULT false,
						   lease interval DEFAULT NULL,
						   retention interval DEFAULT NULL,
						   OUT outcome text, OUT status integer,
						   OUT body bytea, OUT attempt integer,
						   OUT created_at timestamptz,
						   OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_claim_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint bytea DEFAULT NULL,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay'
LANGUAGE C STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint text,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay_text'
LANGUAGE C STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, @extschema@, pg_temp;

CREATE FUNCTION idem_replay(tenant text, endpoint text, key text,
							fingerprint jsonb,
							OUT outcome text, OUT status integer,
							OUT body bytea, OUT attempt integer,
							OUT created_at timestamptz,
							OUT expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_replay_jsonb'
LANGUAGE C STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, @extschema@, pg_temp;

COMMENT ON FUNCTION idem_claim(text, text, text, bytea, boolean, interval, interval) IS
	'claim a key before executing a request: claimed, replay, in_progress, mismatch or unknown';
COMMENT ON FUNCTION idem_replay(text, text, text, bytea) IS
	'read-only look-up of what a claim would answer, without claiming';
