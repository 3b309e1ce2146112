-- test/bench/plpg.sql: what a user would otherwise write, the idempotency
-- protocol in PL/pgSQL on a table like idem_record (test/bench/setup.sql,
-- test/bench/sql_shape.sql).
CREATE TABLE plpg_record (LIKE idem_record INCLUDING ALL) WITH (fillfactor = 70);

CREATE FUNCTION plpg_claim(p_tenant text, p_endpoint text, p_key text, p_fp bytea,
						   OUT outcome text, OUT status int, OUT body bytea)
LANGUAGE plpgsql AS $$
DECLARE
	d bytea := sha256(p_fp);
	r plpg_record;
BEGIN
	SELECT * INTO r FROM plpg_record
	 WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key;
	IF FOUND AND r.state = 'succeeded' AND r.expires_at > now() THEN
		IF r.fingerprint IS DISTINCT FROM d THEN
			outcome := 'mismatch';
		ELSE
			outcome := 'replay'; status := r.status; body := r.body;
		END IF;
		RETURN;
	END IF;
	INSERT INTO plpg_record (tenant, endpoint, key, state, fingerprint, attempt,
							 created_at, claimed_at, lease_expires_at, expires_at)
	VALUES (p_tenant, p_endpoint, p_key, 'pending', d, 1, now(), now(),
			now() + interval '5 min', now() + interval '24 hours')
	ON CONFLICT (tenant, endpoint, key) DO NOTHING;
	IF FOUND THEN
		outcome := 'claimed';
		RETURN;
	END IF;
	SELECT * INTO r FROM plpg_record
	 WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key;
	IF r.fingerprint IS DISTINCT FROM d THEN
		outcome := 'mismatch';
	ELSIF r.lease_expires_at > now() THEN
		outcome := 'in_progress';
	ELSE
		outcome := 'unknown';
	END IF;
END
$$;

CREATE FUNCTION plpg_complete(p_tenant text, p_endpoint text, p_key text,
							  p_status int, p_body bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE plpg_record SET state = 'succeeded', status = p_status, body = p_body,
						   finished_at = now()
	 WHERE tenant = p_tenant AND endpoint = p_endpoint AND key = p_key
	   AND state = 'pending';
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no pending claim' USING ERRCODE = '55000';
	END IF;
END
$$;
