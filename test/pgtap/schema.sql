-- test/pgtap/schema.sql: idem's schema, function signatures, volatility and
-- privileges, checked with pgTAP.  Runs in one transaction, rolled back.
BEGIN;
SELECT plan(91);

-- the table and its indexes
SELECT has_table('idem_record');
SELECT columns_are('idem_record', ARRAY[
	'tenant', 'endpoint', 'key', 'state', 'retryable', 'fingerprint',
	'status', 'body', 'attempt', 'created_at', 'claimed_at',
	'lease_expires_at', 'finished_at', 'expires_at', 'headers', 'trace']);
SELECT col_type_is('idem_record', 'fingerprint', 'bytea');
SELECT col_type_is('idem_record', 'body', 'bytea');
SELECT col_type_is('idem_record', 'headers', 'jsonb');
SELECT col_type_is('idem_record', 'status', 'integer');
SELECT col_type_is('idem_record', 'expires_at', 'timestamp with time zone');
SELECT col_not_null('idem_record', 'tenant');
SELECT col_not_null('idem_record', 'endpoint');
SELECT col_not_null('idem_record', 'key');
SELECT has_index('idem_record', 'idem_record_key', ARRAY['tenant', 'endpoint', 'key']);
SELECT index_is_unique('idem_record', 'idem_record_key');
SELECT has_index('idem_record', 'idem_record_expires', ARRAY['expires_at']);
SELECT is((SELECT count(*)::int FROM pg_index
			WHERE indrelid = 'idem_record'::regclass AND indisunique),
		  1, 'the key index is the only unique index');

-- the functions, their result types and volatility
SELECT has_function('idem_claim', ARRAY['text', 'text', 'text', 'bytea', 'boolean', 'interval', 'interval', 'interval']);
SELECT has_function('idem_claim', ARRAY['text', 'text', 'text', 'text', 'boolean', 'interval', 'interval', 'interval']);
SELECT has_function('idem_claim', ARRAY['text', 'text', 'text', 'jsonb', 'boolean', 'interval', 'interval', 'interval']);
SELECT has_function('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'integer', 'jsonb']);
SELECT has_function('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'text', 'integer', 'jsonb']);
SELECT has_function('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'jsonb', 'integer', 'jsonb']);
SELECT has_function('idem_fail', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'boolean', 'integer', 'jsonb']);
SELECT has_function('idem_fail', ARRAY['text', 'text', 'text', 'integer', 'text', 'boolean', 'integer', 'jsonb']);
SELECT has_function('idem_fail', ARRAY['text', 'text', 'text', 'integer', 'jsonb', 'boolean', 'integer', 'jsonb']);
SELECT has_function('idem_replay', ARRAY['text', 'text', 'text', 'bytea']);
SELECT has_function('idem_replay', ARRAY['text', 'text', 'text', 'text']);
SELECT has_function('idem_replay', ARRAY['text', 'text', 'text', 'jsonb']);
SELECT has_function('idem_release', ARRAY['text', 'text', 'text', 'integer']);
SELECT has_function('idem_purge', ARRAY[]::name[]);
SELECT has_function('idem_claim_many', ARRAY['text', 'text', 'text[]', 'bytea[]', 'interval', 'interval']);
SELECT has_function('idem_claim_many', ARRAY['text', 'text', 'text[]', 'text[]', 'interval', 'interval']);
SELECT has_function('idem_claim_many', ARRAY['text', 'text', 'text[]', 'jsonb[]', 'interval', 'interval']);
SELECT has_function('idem_complete_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'integer[]', 'jsonb[]']);
SELECT has_function('idem_fail_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'boolean', 'integer[]', 'jsonb[]']);

SELECT function_returns('idem_claim', ARRAY['text', 'text', 'text', 'bytea', 'boolean', 'interval', 'interval', 'interval'], 'record');
SELECT function_returns('idem_replay', ARRAY['text', 'text', 'text', 'bytea'], 'setof record');
SELECT function_returns('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'integer', 'jsonb'], 'void');
SELECT function_returns('idem_release', ARRAY['text', 'text', 'text', 'integer'], 'boolean');
SELECT function_returns('idem_purge', ARRAY[]::name[], 'bigint');
SELECT function_returns('idem_claim_many', ARRAY['text', 'text', 'text[]', 'bytea[]', 'interval', 'interval'], 'setof record');
SELECT function_returns('idem_complete_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'integer[]', 'jsonb[]'], 'integer');
SELECT function_returns('idem_fail_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'boolean', 'integer[]', 'jsonb[]'], 'integer');
SELECT is(
	(SELECT array_agg(n ORDER BY o) FROM pg_proc p,
		unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a(n, m, o)
	  WHERE p.oid = 'idem_claim_many(text, text, text[], bytea[], interval, interval)'::regprocedure
		AND m = 't'),
	ARRAY['key', 'outcome', 'status', 'body', 'headers', 'attempt', 'created_at', 'expires_at']::text[],
	'idem_claim_many returns the key, then idem_claim''s columns');
SELECT is(
	(SELECT array_agg(n ORDER BY o) FROM pg_proc p,
		unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a(n, m, o)
	  WHERE p.oid = 'idem_claim(text, text, text, bytea, boolean, interval, interval, interval)'::regprocedure
		AND m = 'o'),
	ARRAY['outcome', 'status', 'body', 'headers', 'attempt', 'created_at', 'expires_at']::text[],
	'idem_claim returns outcome, status, body, headers, attempt, created_at, expires_at');

SELECT volatility_is('idem_claim', ARRAY['text', 'text', 'text', 'bytea', 'boolean', 'interval', 'interval', 'interval'], 'volatile');
SELECT volatility_is('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'integer', 'jsonb'], 'volatile');
SELECT volatility_is('idem_fail', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'boolean', 'integer', 'jsonb'], 'volatile');
SELECT volatility_is('idem_release', ARRAY['text', 'text', 'text', 'integer'], 'volatile');
SELECT volatility_is('idem_replay', ARRAY['text', 'text', 'text', 'bytea'], 'stable');
SELECT volatility_is('idem_purge', ARRAY[]::name[], 'volatile');
SELECT volatility_is('idem_claim_many', ARRAY['text', 'text', 'text[]', 'bytea[]', 'interval', 'interval'], 'volatile');
SELECT volatility_is('idem_complete_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'integer[]', 'jsonb[]'], 'volatile');
SELECT volatility_is('idem_fail_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'boolean', 'integer[]', 'jsonb[]'], 'volatile');

-- every API function runs as its caller (so that the tenant binding sees
-- who calls), without a SET clause (the C code pins search_path around the
-- SQL it runs), and is not strict (a NULL
-- argument is an error, not a NULL result); no function of the extension
-- is SECURITY DEFINER
SELECT is((SELECT count(*)::int FROM pg_proc
			WHERE pronamespace = 'public'::regnamespace
			  AND proname IN ('idem_claim', 'idem_complete', 'idem_fail',
							  'idem_replay', 'idem_release', 'idem_purge',
							  'idem_claim_many', 'idem_complete_many',
							  'idem_fail_many')),
		  19, 'nineteen API functions');
SELECT is((SELECT count(*)::int FROM pg_proc
			WHERE pronamespace = 'public'::regnamespace
			  AND proname IN ('idem_claim', 'idem_complete', 'idem_fail',
							  'idem_replay', 'idem_release', 'idem_purge',
							  'idem_claim_many', 'idem_complete_many',
							  'idem_fail_many', 'idem_list', 'idem_forget')
			  AND NOT prosecdef AND NOT proisstrict
			  AND proconfig IS NULL),
		  21, 'API and operator functions are not SECURITY DEFINER, not strict, without a SET clause');
SELECT is((SELECT count(*)::int FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
			WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
			  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
			  AND p.prosecdef
			  AND p.prorettype <> 'trigger'::regtype),
		  0, 'no function of the extension but a trigger is SECURITY DEFINER');

-- parallel labels: what reads nothing a parallel worker lacks is SAFE;
-- every other function reads the tenant binding with the latest snapshot,
-- which parallel mode forbids, and is UNSAFE
SELECT results_eq($$SELECT p.proparallel::text,
						   string_agg(DISTINCT p.proname::text, ' ' ORDER BY p.proname::text) COLLATE "default"
					  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
					 WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
					   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
					   AND p.proparallel <> 'u'
					 GROUP BY p.proparallel ORDER BY 1$$,
				  $$VALUES ('s', 'idem_role_in idem_role_out idem_stats_read')$$,
				  'parallel safe functions');

-- the counters: a view for pg_monitor, a reset for admins
SELECT has_view('idem_stats');
SELECT columns_are('idem_stats', ARRAY[
	'datid', 'datname', 'claims_claimed', 'claims_replay',
	'claims_in_progress', 'claims_mismatch', 'claims_unknown', 'completes',
	'fails', 'fails_retryable', 'releases', 'purged', 'last_purge',
	'last_purge_ms', 'stats_reset', 'claims_frozen']);
SELECT table_privs_are('idem_stats', 'pg_monitor', ARRAY['SELECT']);

-- privileges: PUBLIC may execute the API and may not touch the table
CREATE ROLE idem_tap_app;
SELECT table_privs_are('idem_record', 'idem_tap_app', ARRAY[]::text[]);
SELECT table_privs_are('idem_attempt_floor', 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_claim', ARRAY['text', 'text', 'text', 'bytea', 'boolean', 'interval', 'interval', 'interval'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_complete', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'integer', 'jsonb'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_fail', ARRAY['text', 'text', 'text', 'integer', 'bytea', 'boolean', 'integer', 'jsonb'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_replay', ARRAY['text', 'text', 'text', 'bytea'], 'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_release', ARRAY['text', 'text', 'text', 'integer'], 'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_purge', ARRAY[]::name[], 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_claim_many', ARRAY['text', 'text', 'text[]', 'bytea[]', 'interval', 'interval'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_complete_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'integer[]', 'jsonb[]'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_fail_many', ARRAY['text', 'text', 'text[]', 'integer[]', 'bytea[]', 'boolean', 'integer[]', 'jsonb[]'],
						  'idem_tap_app', ARRAY['EXECUTE']);
SELECT function_privs_are('idem_stats_reset', ARRAY[]::name[], 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_list', ARRAY['text', 'text', 'boolean', 'integer'], 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_forget', ARRAY['text', 'text', 'text'], 'idem_tap_app', ARRAY[]::text[]);
SELECT ok((SELECT relrowsecurity FROM pg_class WHERE oid = 'idem_record'::regclass),
		  'row-level security is enabled on idem_record');
SELECT policies_are('idem_record', ARRAY['idem_record_tenant']);
SELECT policy_cmd_is('idem_record', 'idem_record_tenant', 'SELECT');
SELECT table_privs_are('idem_binding', 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_bind', ARRAY['regrole', 'text'], 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_unbind', ARRAY['regrole'], 'idem_tap_app', ARRAY[]::text[]);
SELECT function_privs_are('idem_tenant', ARRAY[]::name[], 'idem_tap_app', ARRAY['EXECUTE']);
SELECT table_privs_are('idem_stats', 'idem_tap_app', ARRAY[]::text[]);

SET ROLE idem_tap_app;
SELECT throws_ok('SELECT * FROM idem_record', '42501', NULL, 'the application cannot read the table');
SELECT throws_ok($$INSERT INTO idem_record (tenant, endpoint, key, state, attempt, created_at,
					 claimed_at, lease_expires_at, expires_at)
				   VALUES ('t', 'e', 'k', 'succeeded', 1, now(), now(), now(), now() + '1d')$$,
				 '42501', NULL, 'the application cannot forge a record');
SELECT throws_ok('UPDATE idem_record SET body = NULL', '42501', NULL, 'the application cannot alter a record');
SELECT throws_ok('DELETE FROM idem_record', '42501', NULL, 'the application cannot delete a record');
SELECT throws_ok('SELECT idem_purge()', '42501', NULL, 'the application cannot purge');
SELECT throws_ok('SELECT * FROM idem_binding', '42501', NULL, 'the application cannot read the bindings');
SELECT results_eq($$SELECT outcome FROM idem_claim('t', 'e', 'tap')$$,
				  ARRAY['claimed'], 'the application claims through the API');
SELECT lives_ok($$SELECT idem_complete('t', 'e', 'tap', 200, 'ok')$$, 'and completes');
SELECT results_eq($$SELECT outcome, status FROM idem_replay('t', 'e', 'tap')$$,
				  $$VALUES ('replay', 200)$$, 'and replays');
SELECT results_eq($$SELECT key, outcome FROM idem_claim_many('t', 'e', ARRAY['tap', 'tap2'])$$,
				  $$VALUES ('tap', 'replay'), ('tap2', 'claimed')$$, 'and claims a batch');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
