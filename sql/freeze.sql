--
-- freeze.sql: idem_freeze / idem_thaw / idem_frozen and the "frozen"
-- outcome (0.4.0).  While a tenant's endpoint is frozen, a claim that would
-- execute (a new key, a retryable failure, a released claim) answers
-- frozen and writes nothing; a finished key replays, a pending claim can
-- still be finished, in_progress and mismatch answer as before; until
-- lifts a freeze by itself.  Not executable by PUBLIC; a bound role granted
-- them acts on its own tenant only.
--
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'done');
SELECT idem_complete('acme', 'POST /v1/orders', 'done', 201, 'created');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'pending');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'retry');
SELECT idem_fail('acme', 'POST /v1/orders', 'retry', 503, 'down', retryable => true);
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'released');
SELECT idem_release('acme', 'POST /v1/orders', 'released');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'fp', fingerprint => 'a');
SELECT idem_complete('acme', 'POST /v1/orders', 'fp', 200, 'ok');

SELECT idem_freeze('acme', 'POST /v1/orders', 'double charges, INC-42');
SELECT idem_freeze('acme', 'POST /v1/orders', 'double charges, INC-42 (bis)');
SELECT * FROM idem_frozen('acme', 'POST /v1/orders');
SELECT * FROM idem_frozen('acme', 'POST /v1/refunds');
SELECT * FROM idem_frozen('globex', 'POST /v1/orders');
-- a new key, a retryable failure, a released claim: frozen, nothing written
SELECT outcome, status, attempt FROM idem_claim('acme', 'POST /v1/orders', 'new');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /v1/orders', 'retry');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'released');
SELECT key, state, attempt FROM idem_record ORDER BY key;
-- a finished key replays, a mismatch is a mismatch, idem_replay answers as a claim
SELECT outcome, status, convert_from(body, 'UTF8') FROM idem_claim('acme', 'POST /v1/orders', 'done');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'fp', fingerprint => 'b');
SELECT outcome FROM idem_replay('acme', 'POST /v1/orders', 'new');
SELECT outcome FROM idem_replay('acme', 'POST /v1/orders', 'done');
-- a pending claim within its lease is in_progress, and can still complete
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'pending');
SELECT idem_complete('acme', 'POST /v1/orders', 'pending', 200, 'late');
-- batches
SELECT key, outcome FROM idem_claim_many('acme', 'POST /v1/orders', ARRAY['new', 'done', 'other']);
-- other endpoints and tenants are not frozen
SELECT outcome FROM idem_claim('acme', 'POST /v1/refunds', 'new');
SELECT outcome FROM idem_claim('globex', 'POST /v1/orders', 'new');
SELECT idem_thaw('acme', 'POST /v1/orders');
SELECT idem_thaw('acme', 'POST /v1/orders');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'new');
SELECT outcome, attempt FROM idem_claim('acme', 'POST /v1/orders', 'retry');

-- every endpoint of a tenant; the endpoint's own freeze says more
SELECT idem_freeze('acme', NULL, 'all of acme');
SELECT idem_freeze('acme', 'POST /v1/refunds', 'refunds');
SELECT * FROM idem_frozen('acme', 'GET /v1/anything');
SELECT * FROM idem_frozen('acme', 'POST /v1/refunds');
SELECT outcome FROM idem_claim('acme', 'GET /v1/anything', 'k');
SELECT idem_thaw('acme', NULL);
SELECT outcome FROM idem_claim('acme', 'GET /v1/anything', 'k');
SELECT outcome FROM idem_claim('acme', 'POST /v1/refunds', 'k');
SELECT idem_thaw('acme', 'POST /v1/refunds');

-- until lifts it by itself; an until in the past is refused
SELECT idem_freeze('acme', 'POST /v1/short', 'brief', now() + interval '1 second');
SELECT outcome FROM idem_claim('acme', 'POST /v1/short', 'k');
SELECT pg_sleep(1.2);
SELECT outcome FROM idem_claim('acme', 'POST /v1/short', 'k');
SELECT idem_freeze('acme', 'POST /v1/short', 'late', '2000-01-01 00:00:00+00');
SELECT idem_thaw('acme', 'POST /v1/short');

-- the table as the operator reads it
SELECT idem_freeze('acme', 'POST /v1/orders', 'second look');
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'after');
SELECT frozen_at IS NOT NULL AS dated, tenant, endpoint, reason, until FROM idem_freeze;
-- a write that bypasses the functions still reaches every backend's copy
DELETE FROM idem_freeze;
SELECT outcome FROM idem_claim('acme', 'POST /v1/orders', 'after');

-- privileges and the binding
CREATE ROLE freeze_acme LOGIN;
SELECT idem_bind('freeze_acme', 'acme');
SET ROLE freeze_acme;
SELECT idem_freeze('acme', 'POST /v1/orders');
SELECT * FROM idem_frozen('globex', 'POST /v1/orders');
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_freeze(text, text, text, timestamptz), idem_thaw(text, text) TO freeze_acme;
GRANT SELECT ON idem_freeze TO freeze_acme;
SELECT idem_freeze('globex', 'POST /v1/orders', 'globex''s');
SET ROLE freeze_acme;
SELECT idem_freeze('globex', 'POST /v1/orders');
SELECT idem_thaw('globex', 'POST /v1/orders');
SELECT idem_freeze('acme', 'POST /v1/orders', 'acme''s own');
SELECT tenant, endpoint FROM idem_freeze;
SELECT * FROM idem_frozen('acme', 'POST /v1/orders');
SELECT idem_thaw('acme', 'POST /v1/orders');
RESET ROLE;
SELECT tenant, endpoint FROM idem_freeze;
SELECT idem_thaw('globex', 'POST /v1/orders');
REVOKE ALL ON idem_freeze FROM freeze_acme;
REVOKE EXECUTE ON FUNCTION idem_freeze(text, text, text, timestamptz), idem_thaw(text, text) FROM freeze_acme;
SELECT idem_unbind('freeze_acme');
DROP ROLE freeze_acme;

-- bad input
SELECT idem_freeze(NULL, 'e');
SELECT idem_freeze('', 'e');
SELECT idem_freeze('t', '');
SELECT idem_thaw(NULL, 'e');
SELECT * FROM idem_frozen('t', NULL);

DROP EXTENSION idem;
