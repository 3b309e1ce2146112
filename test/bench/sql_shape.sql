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
-- what is left without the SET clause (every name schema-qualified, as a
-- definer function with no pinned search_path must have them): proto_plain
-- reads the record alone; proto_sub reads with it whether a subscription
-- exists, which no body can learn but by reading (a standby's and a
-- subscriber's claims are refused at every call)
CREATE FUNCTION proto_plain(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
							OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
	r record;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at
	  INTO r FROM public.idem_record x
	 WHERE x.tenant OPERATOR(pg_catalog.=) p_tenant
	   AND x.endpoint OPERATOR(pg_catalog.=) p_endpoint
	   AND x.key OPERATOR(pg_catalog.=) p_key;
	IF FOUND AND r.state OPERATOR(pg_catalog.=) 'succeeded' AND
	   r.expires_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN
		IF r.fingerprint IS DISTINCT FROM pg_catalog.sha256(p_fp) THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	outcome := 'other';
END
$$;
CREATE FUNCTION proto_sub(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
						  OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
	r record;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at,
		   EXISTS (SELECT FROM pg_catalog.pg_subscription_rel) AS subscribed
	  INTO r FROM public.idem_record x
	 WHERE x.tenant OPERATOR(pg_catalog.=) p_tenant
	   AND x.endpoint OPERATOR(pg_catalog.=) p_endpoint
	   AND x.key OPERATOR(pg_catalog.=) p_key;
	IF r.subscribed THEN
		RAISE EXCEPTION 'subscribed';
	END IF;
	IF FOUND AND r.state OPERATOR(pg_catalog.=) 'succeeded' AND
	   r.expires_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN
		IF r.fingerprint IS DISTINCT FROM pg_catalog.sha256(p_fp) THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	outcome := 'other';
END
$$;
-- a fresh claim and its finish in the same least shape (a definer body per
-- call, no SET clause, nothing read per call but what the contract needs
-- of a fresh key): the record with whether a subscription exists, the
-- key's claim lock (a claim answers in_progress at once, where the
-- hand-written INSERT ... ON CONFLICT waits for an uncommitted one), the
-- insert above the fencing floor, and the floor's bucket locked against a
-- purge raising it; the finish one UPDATE.  The freeze and the binding
-- state are left to the body's choice.  Run as F beside plpg_claim with
-- plpg_complete and proto_complete as its finish.
CREATE FUNCTION proto_fresh(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
							OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
	r record;
	a integer;
BEGIN
	SELECT x.state, x.fingerprint, x.status, x.body, x.expires_at,
		   EXISTS (SELECT FROM pg_catalog.pg_subscription_rel) AS subscribed
	  INTO r FROM (SELECT) o LEFT JOIN public.idem_record x
		ON x.tenant OPERATOR(pg_catalog.=) p_tenant
	   AND x.endpoint OPERATOR(pg_catalog.=) p_endpoint
	   AND x.key OPERATOR(pg_catalog.=) p_key;
	IF r.subscribed THEN
		RAISE EXCEPTION 'subscribed';
	END IF;
	IF r.state IS NOT NULL THEN
		outcome := 'other';
		RETURN;
	END IF;
	IF NOT pg_catalog.pg_try_advisory_xact_lock(
			pg_catalog.hashtextextended(p_tenant OPERATOR(pg_catalog.||) p_endpoint
										OPERATOR(pg_catalog.||) p_key, 42)) THEN
		outcome := 'in_progress';
		RETURN;
	END IF;
	INSERT INTO public.idem_record AS x (tenant, endpoint, key, state, fingerprint,
										 attempt, created_at, claimed_at,
										 lease_expires_at, expires_at)
	SELECT p_tenant, p_endpoint, p_key, 'pending', pg_catalog.sha256(p_fp),
		   COALESCE(f.attempt, 0) OPERATOR(pg_catalog.+) 1,
		   pg_catalog.now(), pg_catalog.now(),
		   pg_catalog.now() OPERATOR(pg_catalog.+) '5 min'::pg_catalog.interval,
		   pg_catalog.now() OPERATOR(pg_catalog.+) '24 hours'::pg_catalog.interval
	  FROM (SELECT) o LEFT JOIN public.idem_attempt_floor f
		ON f.bucket OPERATOR(pg_catalog.=)
		   (pg_catalog.hashtext(p_key) OPERATOR(pg_catalog.&) 4095)
	ON CONFLICT (tenant, endpoint, key) DO NOTHING
	RETURNING x.attempt INTO a;
	PERFORM FROM public.idem_attempt_floor f
	  WHERE f.bucket OPERATOR(pg_catalog.=)
			(pg_catalog.hashtext(p_key) OPERATOR(pg_catalog.&) 4095)
	  FOR KEY SHARE;
	outcome := 'claimed';
END
$$;
CREATE FUNCTION proto_complete(p_tenant text, p_endpoint text, p_key text,
							   p_status int, p_body bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
	UPDATE public.idem_record x
	   SET state = 'succeeded', status = p_status, body = p_body,
		   finished_at = pg_catalog.now()
	 WHERE x.tenant OPERATOR(pg_catalog.=) p_tenant
	   AND x.endpoint OPERATOR(pg_catalog.=) p_endpoint
	   AND x.key OPERATOR(pg_catalog.=) p_key
	   AND x.state OPERATOR(pg_catalog.=) 'pending';
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no pending claim' USING ERRCODE = '55000';
	END IF;
END
$$;
