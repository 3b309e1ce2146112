--
-- A claim's lease and expiry count from the moment of the claim, not from
-- the start of its statement, transaction or CALL.
--
CREATE EXTENSION idem;
SET idem.retry_window = '1s';
SET idem.retention = '4s';

-- a claim late in a long statement
DO $$
DECLARE
	r record;
BEGIN
	PERFORM pg_sleep(2.5);
	SELECT * INTO r FROM idem_claim('t', 'POST /late', 'late', lease => '2 s');
	RAISE NOTICE 'created at the claim: %, expires 4 s after it: %',
		r.created_at >= statement_timestamp() + interval '2.5 s',
		r.expires_at - r.created_at = interval '4 s';
END
$$;
SELECT lease_expires_at - created_at AS lease, claimed_at = created_at AS same
  FROM idem_record WHERE key = 'late';

-- a consumer written as a procedure that commits after every message: each
-- claim counts from its own moment, so a redelivery of the last message
-- right after the CALL (2.5 s after its claim, 5 s after the CALL began)
-- replays it, in the procedure and out of it
CREATE PROCEDURE consume(messages int)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..messages LOOP
		IF (SELECT outcome FROM idem_claim('t', 'queue', 'msg-' || i)) = 'claimed' THEN
			PERFORM idem_complete('t', 'queue', 'msg-' || i, 200, 'done ' || i);
		END IF;
		COMMIT;
		PERFORM pg_sleep(2.5);
	END LOOP;
	RAISE NOTICE 'redelivered msg-%: %', messages,
		(SELECT outcome FROM idem_claim('t', 'queue', 'msg-' || messages));
END
$$;
CALL consume(2);
SELECT outcome, convert_from(body, 'UTF8') AS body
  FROM idem_claim('t', 'queue', 'msg-2');
SELECT max(created_at) - min(created_at) >= interval '2.5 s' AS claimed_apart
  FROM idem_record WHERE endpoint = 'queue';

DROP PROCEDURE consume(int);
RESET idem.retention;
RESET idem.retry_window;
DROP EXTENSION idem;
