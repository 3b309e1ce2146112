-- test/bench/sql_shape.sql: the least a replay of the SQL edition's shape
-- does (doc/performance.md, "How close the edition's shape can come"),
-- beside the hand-written plpg_claim of test/bench/plpg.sql, in a database
-- where sql-edition/idem.sql is installed in schema public and keys
-- r1..r1000 of tenant bench, endpoint 'POST /r' are finished.
-- the hand-written baseline (test/bench/plpg.sql), on a copy of the records
\ir plpg.sql
INSERT INTO plpg_record SELECT * FROM idem_record;
-- the least the SQL edition must do for a replay: an invoker API function
-- (the caller's role, SET search_path) deciding whether a ticket is needed,
-- a definer worker reading the record with the binding state in one query
CREATE FUNCTION proto_worker(p_tenant text, p_endpoint text, p_key text, d bytea,
							 OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
	r record;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at,
		   EXISTS (SELECT FROM idem_binding) OR
		   EXISTS (SELECT FROM idem_setting s WHERE s.name = 'idem.require_binding') AS needed
	  INTO r FROM idem_record x
	 WHERE x.tenant = p_tenant AND x.endpoint = p_endpoint AND x.key = p_key;
	IF r.needed THEN
		RAISE EXCEPTION 'ticket needed';
	END IF;
	IF FOUND AND r.state = 'succeeded' AND r.expires_at > now() THEN
		IF r.fingerprint IS DISTINCT FROM d THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	outcome := 'other';
END
$$;
CREATE FUNCTION proto_claim(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
							OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
	c record;
BEGIN
	IF lower(coalesce(current_setting('idem.require_binding', true), ''))
	   IN ('', 'off', 'of', 'false', 'f', 'no', 'n', '0') THEN
		IF (SELECT t.needed FROM idem_sql_tickets t) THEN
			RAISE EXCEPTION 'ticket needed';
		END IF;
	END IF;
	c := proto_worker(p_tenant, p_endpoint, p_key, sha256(p_fp));
	outcome := c.outcome; status := c.status; body := c.body;
END
$$;
-- the design that drops the second layer (doc/performance.md): while no
-- binding exists and idem.require_binding is off, the API function is
-- itself the definer worker.  proto_one still reads the binding state with
-- the record; proto_bare is the body idem_bind would swap out, which reads
-- none (run as F beside plpg_claim and proto_claim)
CREATE FUNCTION proto_one(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
						  OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
	r record;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at,
		   EXISTS (SELECT FROM idem_binding) OR
		   EXISTS (SELECT FROM idem_setting s WHERE s.name = 'idem.require_binding') AS needed
	  INTO r FROM idem_record x
	 WHERE x.tenant = p_tenant AND x.endpoint = p_endpoint AND x.key = p_key;
	IF r.needed THEN
		RAISE EXCEPTION 'ticket needed';
	END IF;
	IF FOUND AND r.state = 'succeeded' AND r.expires_at > now() THEN
		IF r.fingerprint IS DISTINCT FROM sha256(p_fp) THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	outcome := 'other';
END
$$;
CREATE FUNCTION proto_bare(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
						   OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
	r record;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at
	  INTO r FROM idem_record x
	 WHERE x.tenant = p_tenant AND x.endpoint = p_endpoint AND x.key = p_key;
	IF FOUND AND r.state = 'succeeded' AND r.expires_at > now() THEN
		IF r.fingerprint IS DISTINCT FROM sha256(p_fp) THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	outcome := 'other';
END
$$;
