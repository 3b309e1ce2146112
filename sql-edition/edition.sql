/*
 * edition.sql: what the SQL edition of idem does differently from the C
 * edition, written beside nothing else.  sql-edition/generate.py reads it
 * with idem--<version>.sql, which holds what both editions share (the
 * tables, indexes, views, policies, grants, comments and the functions'
 * signatures), and writes sql-edition/idem.sql and idem_tle.sql.
 *
 * How a call is made safe without a library:
 *
 * - The API functions run as their caller (SECURITY INVOKER, as in the C
 *   edition) and call a worker that runs as the role that installed idem
 *   (SECURITY DEFINER), the only role that may touch the tables.  A worker
 *   cannot see who called it, so the caller hands it a ticket: a row the
 *   caller inserted into idem_sql_ticket, whose CHECK constraints make its
 *   role the inserter's current_user and its backend the inserter's.  The
 *   worker consumes it (idem_sql_as) and binds the call by the three roles
 *   the C edition binds it by: the session user and the role of SET ROLE,
 *   which it reads itself, and the ticket's role (src/tenant.c has the
 *   rules); an operator tool's worker also requires EXECUTE on the tool
 *   for that role, as PostgreSQL checked it on the tool.  Whoever calls a
 *   worker directly can only hand it a ticket of its own.  Where no binding
 *   and no idem.require_binding exist, the calls that only a binding would
 *   refuse hand their worker no ticket, and the worker refuses that once
 *   one exists (idem_sql_tickets).
 * - Only the installer may create objects in idem's schema (checked when
 *   it is installed), so that nothing captures a call that idem's
 *   functions make under their search_path.
 * - The settings that the C edition reserves to a superuser are rows of
 *   idem_setting, which only the installing role may write; a SET of the
 *   same name changes nothing.
 * - A claim that meets an uncommitted claim of its key answers in_progress
 *   without waiting for it: every claim that may insert a key's record
 *   takes the key's advisory lock first, with pg_try_advisory_xact_lock,
 *   and a claim that does not get it answers at once.  A transaction takes
 *   at most idem_sql_claim_locks() such locks (the lock table is shared by
 *   every session); its later claims insert without one, and a claim that
 *   meets such an uncommitted claim waits for it, as wait => true does.
 *
 * - Every function that runs as the role that installed idem, and every
 *   API function, pins its search_path to pg_catalog, idem's schema and
 *   pg_temp.  The helpers that run as their caller set none (a SET clause
 *   costs every call, and keeps a SQL function from being inlined): idem's
 *   functions call them under their pinned search_path, and a role that
 *   calls one itself runs it with its own rights.
 *
 * The directives below are read by generate.py; see its docstring.
 */

--@ omit \bidem_role\w*
--@ omit \bidem_binding_changed\b
--@ omit \bidem_binding_unknown_role\b
--@ omit CREATE TABLE idem_binding\b
--@ omit COMMENT ON TABLE idem_binding\b
--@ omit pg_extension_config_dump\('idem_binding'
--@ omit REVOKE ALL ON idem_binding\b
--@ omit \bidem_freeze_changed\b

--@ before CREATE TABLE idem_record\b
/*
 * idem's functions run as the role that installed it, under a search_path
 * that names idem's schema: a role that may create objects there could
 * capture their calls.  So only the installer (itself, or as the database's
 * owner through pg_database_owner) and superusers may create objects there.
 */
DO $$
DECLARE
	creators	text;
BEGIN
	SELECT string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC'
						   ELSE a.grantee::regrole::text END, ', ')
	  INTO creators
	  FROM pg_catalog.pg_namespace n,
		   pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a
	 WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
	   AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
	   AND (a.grantee OPERATOR(pg_catalog.=) 0 OR NOT (
			a.grantee OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
											   WHERE r.rolname OPERATOR(pg_catalog.=) current_user) OR
			(a.grantee OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.regrole AND
			 pg_catalog.pg_has_role(current_user, a.grantee, 'MEMBER')) OR
			(SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) a.grantee)));
	IF creators IS NOT NULL THEN
		RAISE EXCEPTION 'schema "%" lets other roles create objects', pg_catalog.current_schema()
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = pg_catalog.format('%s may create objects in it, which could capture the calls of idem''s functions.', creators),
				  HINT = 'Install idem in a schema where only its installer may create objects, e.g. CREATE SCHEMA idem, then CREATE EXTENSION idem SCHEMA idem, or SET search_path = idem before running idem.sql.';
	END IF;
END
$$;
--@ end

--@ before CREATE TABLE idem_binding\b
/*
 * The tenant bindings (the C edition's table, with regrole for its own
 * role type, which needs a library).  Written by idem_bind() and
 * idem_unbind(), which only the role that installed idem may call.
 */
CREATE TABLE idem_binding (
	role				regrole PRIMARY KEY,
	tenant				text COLLATE "C" NOT NULL
		CHECK (octet_length(tenant) BETWEEN 1 AND 255)
);

COMMENT ON TABLE idem_binding IS
	'tenant bindings: each role may touch only its tenant; change with idem_bind() and idem_unbind()';

SELECT pg_catalog.pg_extension_config_dump('idem_binding', '');

REVOKE ALL ON idem_binding FROM PUBLIC;

/*
 * The settings that the C edition reserves to a superuser, where only the
 * role that installed idem may write them.  A missing row is the C
 * edition's default.
 */
CREATE TABLE idem_setting (
	name				text PRIMARY KEY
		CHECK (name IN ('idem.max_retention', 'idem.max_lease',
						'idem.require_binding', 'idem.max_body_size',
						'idem.log_outcomes')),
	value				text NOT NULL
);

COMMENT ON TABLE idem_setting IS
	'the SQL edition''s superuser-only settings: only the role that installed idem may change them';

SELECT pg_catalog.pg_extension_config_dump('idem_setting', '');

REVOKE ALL ON idem_setting FROM PUBLIC;

CREATE FUNCTION idem_edition()
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'sql' $$;

COMMENT ON FUNCTION idem_edition() IS
	'which edition of idem this is: sql (this one) or c';

/*
 * Tickets: who calls a worker (see the head of this file).  Any role may
 * insert one, and the CHECK constraints make it name the inserting role
 * (by its name, which a cast to regrole would fold to lower case) and
 * backend whatever the INSERT says; only the role that installed idem
 * reads and deletes them.  Unlogged: a ticket lives for one call, and
 * idem_purge() deletes those of backends that have ended (a ticket
 * inserted directly and committed is never consumed).
 */
CREATE UNLOGGED TABLE idem_sql_ticket (
	id					bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	role				oid NOT NULL DEFAULT (to_regrole(quote_ident(current_user))::oid)
		CHECK (role = to_regrole(quote_ident(current_user))::oid),
	pid					integer NOT NULL DEFAULT pg_backend_pid()
		CHECK (pid = pg_backend_pid())
);

COMMENT ON TABLE idem_sql_ticket IS
	'who calls a worker of idem''s SQL edition: a row per call, consumed by the call';

REVOKE ALL ON idem_sql_ticket FROM PUBLIC;
/* not on id: a caller must not plant the ids the next tickets get */
GRANT INSERT (role) ON idem_sql_ticket TO PUBLIC;
GRANT SELECT (id) ON idem_sql_ticket TO PUBLIC;

/* A ticket of the current role, for the worker about to be called */
CREATE FUNCTION idem_sql_ticket()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	id			bigint;
BEGIN
	INSERT INTO idem_sql_ticket AS t DEFAULT VALUES RETURNING t.id INTO id;
	RETURN id;
END
$$;

/*
 * The role whose ticket this is, the ticket consumed; 42501 for a ticket
 * of another backend or none
 */
CREATE FUNCTION idem_sql_as(ticket bigint)
RETURNS oid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	who			oid;
BEGIN
	DELETE FROM idem_sql_ticket t
	 WHERE t.id = ticket AND t.pid = pg_backend_pid()
	RETURNING t.role INTO who;
	IF who IS NULL THEN
		RAISE EXCEPTION 'permission denied: idem call without a ticket of its caller'
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'Call idem''s API functions.';
	END IF;
	RETURN who;
END
$$;

/*
 * A ticket only where a binding may decide: the calls that a binding
 * concerns and no operator's rights (claims, their finishes and replays,
 * the outbox's enqueues, takes and deliveries) check the caller's role
 * only against the bindings and idem.require_binding.  Where neither
 * exists, as in a database of one tenant, their API functions hand the
 * worker no ticket (idem_sql_caller), and the call writes nothing it need
 * not: a replay is then a read-only transaction.  The worker does not
 * trust that choice: idem_sql_restriction refuses a call without a ticket
 * once a binding exists or idem.require_binding is on (42501, as for a
 * worker called without a ticket), so under READ COMMITTED a binding made
 * between the API function's look and the worker's fails that one call,
 * never opens it (under REPEATABLE READ a binding holds from the
 * transaction's end, ticket or none: README's table of differences).
 * The claims and finishes hand their worker ticket 0 instead, and the
 * worker's own look (idem_sql_state) decides: a binding committed after
 * it holds from the next call on, as for a call that began
 * before the binding.  PUBLIC may read this view: it tells whether any
 * binding exists, not which.
 */
CREATE VIEW idem_sql_tickets AS
	SELECT EXISTS (SELECT FROM idem_binding) OR
		   EXISTS (SELECT FROM idem_setting s
					WHERE s.name = 'idem.require_binding') AS needed;

COMMENT ON VIEW idem_sql_tickets IS
	'whether the SQL edition''s calls hand their worker a ticket: some tenant binding or idem.require_binding is set';

REVOKE ALL ON idem_sql_tickets FROM PUBLIC;
GRANT SELECT ON idem_sql_tickets TO PUBLIC;

/*
 * What a worker handed ticket 0 (no ticket, and a question) must know
 * before it may answer without idem_sql_claim_as or idem_sql_finish_as,
 * in one read of the small tables:
 *   ticketed: a binding may decide (a binding, or idem.require_binding
 *     in idem_setting or SET in the session, where a superuser's session
 *     may tighten it): the worker answers nothing, and the API function
 *     calls it again with a ticket of its caller;
 *   subscribed: a subscription of idem_record, whose decisions belong to
 *     the publisher (idem_sql_require_primary refuses them);
 *   settings: a row of idem.log_outcomes, idem.max_lease or
 *     idem.max_retention, which a claim must read.
 * A view, which the reading statement takes in (the columns it does not
 * read are not computed).  The tables are read whole, by conditions that
 * no index serves: under the workers' enable_seqscan = off each would be
 * an index scan, and each index scan's start allocates some 20 kB
 * (btbeginscan), which costs more than reading a few rows.
 */
CREATE VIEW idem_sql_state AS
	SELECT EXISTS (SELECT FROM idem_binding b WHERE b.tenant IS NOT NULL) OR
		   coalesce(s.require, false) OR
		   lower(coalesce(current_setting('idem.require_binding', true), ''))
		   NOT IN ('', 'off', 'of', 'false', 'f', 'no', 'n', '0') AS ticketed,
		   coalesce((SELECT bool_or(sr.srrelid = 'idem_record'::regclass AND
									sr.srsubstate IS NOT NULL)
					   FROM pg_subscription_rel sr), false) AS subscribed,
		   coalesce(s.other, false) AS settings
	  FROM (SELECT bool_or(s.name = 'idem.require_binding' AND s.value IS NOT NULL) AS require,
				   bool_or(s.name IN ('idem.log_outcomes', 'idem.max_lease',
									  'idem.max_retention') AND
						   s.value IS NOT NULL) AS other
			  FROM idem_setting s) s;

COMMENT ON VIEW idem_sql_state IS
	'what the SQL edition''s workers read before they answer a call without a ticket: whether a binding may decide, a subscription feeds idem_record or a setting row a claim reads exists';

REVOKE ALL ON idem_sql_state FROM PUBLIC;

/*
 * The ticket of a call that a binding concerns: a ticket of the current
 * role (idem_sql_ticket) where a binding may decide, else NULL (see
 * idem_sql_tickets; a SET of idem.require_binding to anything but off
 * counts, since a superuser's session may tighten it)
 */
CREATE FUNCTION idem_sql_caller()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
	IF lower(coalesce(current_setting('idem.require_binding', true), ''))
	   IN ('', 'off', 'of', 'false', 'f', 'no', 'n', '0') THEN
		IF NOT (SELECT t.needed FROM idem_sql_tickets t) THEN
			RETURN NULL;
		END IF;
	END IF;
	RETURN idem_sql_ticket();
END
$$;

/*
 * The role of the ticket of a call that a binding concerns, consumed
 * (idem_sql_as), or NULL for none: idem_sql_restriction then refuses the
 * call if a binding may decide
 */
CREATE FUNCTION idem_sql_as_caller(ticket bigint)
RETURNS oid
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
	IF ticket IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN idem_sql_as(ticket);
END
$$;

/* An operator tool's worker: EXECUTE on the tool, for the role of the ticket */
CREATE FUNCTION idem_sql_require_execute(role oid, tool text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	IF role IS NULL OR
	   NOT coalesce(has_function_privilege(role, to_regprocedure(tool), 'EXECUTE'), false) THEN
		RAISE EXCEPTION 'permission denied for function %', split_part(tool, '(', 1)
			USING ERRCODE = 'insufficient_privilege';
	END IF;
END
$$;

/*
 * The salt of the keys' advisory locks, which only the role that installed
 * idem reads: another role cannot compute the lock of a key to hold it
 */
CREATE TABLE idem_sql_secret (
	lock_salt			bigint NOT NULL,
	freezes				bigint NOT NULL DEFAULT 0	/* idem_sql_freeze_seen() */
);

INSERT INTO idem_sql_secret
	SELECT ((random() - 0.5) * 9.2e18)::bigint;

REVOKE ALL ON idem_sql_secret FROM PUBLIC;

/*
 * Whether the row version of a row the caller read has this transaction's,
 * or one of its subtransactions', xmin.  Such an xid is at most 2^31 ahead
 * of the top transaction's, whose 64-bit id gives the epoch; the row was
 * visible, so its inserter is either this transaction or committed before
 * the current snapshot, whose xmax it then precedes.  (A row frozen over
 * 2^31 transactions ago may be mistaken for this transaction's: callers
 * ask only of rows written since this transaction began.)
 */
CREATE FUNCTION idem_sql_own(xmin xid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	top			bigint := pg_current_xact_id_if_assigned()::text::bigint;
	ahead		bigint;
	xid64		bigint;
BEGIN
	IF xmin IS NULL OR top IS NULL THEN
		RETURN false;
	END IF;
	ahead := (xmin::text::bigint - (top & 4294967295) + 4294967296) % 4294967296;
	IF ahead >= 2147483648 THEN
		RETURN false;
	END IF;
	xid64 := top + ahead;
	IF xid64 >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint THEN
		RETURN true;
	END IF;
	RETURN pg_xact_status(xid64::text::xid8) = 'in progress';
END
$$;

/*
 * A time setting's value as the C edition's GUC reads it: a number without
 * a unit is in the setting's base unit (unit: 's' or 'ms').
 */
CREATE FUNCTION idem_sql_time(value text, unit text)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF value ~ '^\s*[-+]?[0-9]+(\.[0-9]*)?\s*$' THEN
		RETURN (value || ' ' || unit)::interval;
	END IF;
	RETURN value::interval;
END
$$;

/*
 * A superuser-only setting of the SQL edition, as text: its row of
 * idem_setting, or the default.  Read by idem's functions that run as the
 * role that installed idem, which alone may read idem_setting.
 */
CREATE FUNCTION idem_sql_setting(name text, fallback text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	value		text;
BEGIN
	SELECT s.value INTO value FROM idem_setting s WHERE s.name = idem_sql_setting.name;
	RETURN coalesce(value, fallback);
END
$$;

/*
 * The SET of a superuser-only setting's name in a session that a superuser
 * logged in, else NULL.  Without a library any role may SET an idem. name,
 * and in such a session SET ROLE lets a role that is no superuser make the
 * SET: so it is read only where it makes the table's value stricter (a
 * smaller cap, a binding required, more decisions logged), never where it
 * would loosen it.  The C edition's tests SET these names as a superuser
 * to tighten them, and run unchanged.
 */
CREATE FUNCTION idem_sql_session_setting(name text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	value		text := current_setting(name, true);
BEGIN
	/* two tests: the first is a simple expression, run without the executor */
	IF coalesce(value, '') = '' THEN
		RETURN NULL;
	END IF;
	IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user), false) THEN
		RETURN NULL;
	END IF;
	RETURN value;
END
$$;

/*
 * A cap on a span (idem.max_retention, idem.max_lease; 0: none, a bare
 * number in unit): idem_setting's, or a smaller one of
 * idem_sql_session_setting.  A negative value, which the C edition's
 * setting refuses, raises its error rather than read as no cap.
 */
CREATE FUNCTION idem_sql_cap(name text, unit text)
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	t_text		text := idem_sql_setting(name, '0');
	s_text		text := idem_sql_session_setting(name);
	t			interval := idem_sql_time(t_text, unit);
	s			interval := idem_sql_time(s_text, unit);
BEGIN
	IF t < '0' OR s < '0' THEN
		RAISE EXCEPTION 'invalid value for parameter "%": "%"',
			name, CASE WHEN t < '0' THEN t_text ELSE s_text END
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A cap is 0, for none, or a positive span.';
	END IF;
	IF s IS NULL OR s = '0' THEN
		RETURN t;
	END IF;
	IF t = '0' THEN
		RETURN s;
	END IF;
	RETURN least(t, s);
END
$$;

/*
 * A memory setting's value in kB, as the C edition's GUC reads it: a
 * number without a unit is in kB, and at most what one allocation holds
 * (src/settings.c's IDEM_MAX_BODY_KB).  A value the GUC would refuse
 * raises its error rather than read as no limit.
 */
CREATE FUNCTION idem_sql_kilobytes(name text, value text)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
	m			text[];
	kb			bigint;
BEGIN
	/* a bare number of kB, as the default is, without the pattern below */
	IF value ~ '^[0-9]{1,7}$' THEN
		kb := value::bigint;
		IF kb <= 1048575 THEN
			RETURN kb;
		END IF;
	END IF;
	m := regexp_match(value, '^\s*([0-9]+(?:\.[0-9]*)?)\s*(|B|kB|MB|GB|TB)\s*$');
	IF m IS NULL THEN
		RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, value
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".';
	END IF;
	kb := (m[1]::numeric * CASE m[2] WHEN '' THEN 1 WHEN 'kB' THEN 1
									WHEN 'B' THEN 1.0 / 1024 WHEN 'MB' THEN 1024
									WHEN 'GB' THEN 1024 * 1024
									WHEN 'TB' THEN 1024 * 1024 * 1024 END)::bigint;
	IF kb > 1048575 THEN
		RAISE EXCEPTION '% kB is outside the valid range for parameter "%" (0 .. 1048575)', kb, name
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN kb;
END
$$;

/*
 * idem.max_body_size in bytes: idem_setting's, or a smaller one of
 * idem_sql_session_setting
 */
CREATE FUNCTION idem_sql_body_limit()
RETURNS bigint
LANGUAGE sql STABLE
AS $$
	SELECT least(idem_sql_kilobytes('idem.max_body_size',
									idem_sql_setting('idem.max_body_size', '1024')),
				 idem_sql_kilobytes('idem.max_body_size',
									idem_sql_session_setting('idem.max_body_size'))) * 1024
$$;

/*
 * idem.require_binding: on in idem_setting, or SET on in a session of
 * idem_sql_session_setting
 */
CREATE FUNCTION idem_sql_require_binding()
RETURNS boolean
LANGUAGE sql STABLE
AS $$
	SELECT idem_sql_setting('idem.require_binding', 'off')::boolean OR
		   coalesce(idem_sql_session_setting('idem.require_binding')::boolean, false)
$$;

/*
 * A value of idem.log_outcomes as a level: 0 off, 1 conflicts, 2 on, with
 * the C edition's spellings (src/settings.c, its hidden boolean ones
 * included, in any case); another value raises the setting's error rather
 * than read as off
 */
CREATE FUNCTION idem_sql_log_level(value text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
BEGIN
	CASE lower(value)
		WHEN 'off', 'false', 'no', '0' THEN RETURN 0;
		WHEN 'conflicts' THEN RETURN 1;
		WHEN 'on', 'true', 'yes', '1' THEN RETURN 2;
		ELSE
			RAISE EXCEPTION 'invalid value for parameter "idem.log_outcomes": "%"', value
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Available values: off, on, conflicts.';
	END CASE;
END
$$;

/*
 * idem.log_outcomes: the higher of idem_setting's and of
 * idem_sql_session_setting's levels
 */
CREATE FUNCTION idem_sql_log_outcomes()
RETURNS text
LANGUAGE sql STABLE
AS $$
	SELECT (ARRAY['off', 'conflicts', 'on'])[
		1 + greatest(idem_sql_log_level(idem_sql_setting('idem.log_outcomes', 'off')),
					 coalesce(idem_sql_log_level(idem_sql_session_setting('idem.log_outcomes')), 0))]
$$;

/* A setting any role may set (idem.retention, idem.lease, ...), or the default */
CREATE FUNCTION idem_sql_guc(name text, fallback text)
RETURNS text
LANGUAGE sql STABLE
AS $$
	SELECT coalesce(nullif(current_setting(name, true), ''), fallback)
$$;

/*
 * Whether role may do what the C edition asks a superuser for: it is a
 * superuser, or has the privileges of the role that installed idem (the
 * owner of this function, current_user inside it).
 */
CREATE FUNCTION idem_sql_is_admin(role oid)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
	SELECT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.oid = role), false)
		OR pg_has_role(role, current_user, 'USAGE')
$$;

/*
 * Bindings are the C edition's superuser's to change (src/tenant.c's
 * require_superuser): here a superuser's, or those of a role with the
 * privileges of the role that installed idem, whoever was granted EXECUTE
 * on idem_bind.  idem_bind and idem_unbind run as their caller, so
 * current_user is the caller, and the role that passes may write
 * idem_binding itself.
 */
CREATE FUNCTION idem_sql_require_binder()
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	IF NOT coalesce(idem_sql_is_admin((SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)), false) THEN
		RAISE EXCEPTION 'must be superuser to change idem tenant bindings'
			USING ERRCODE = 'insufficient_privilege';
	END IF;
END
$$;

/* The message of a call that the binding refuses, naming tenant if known */
CREATE FUNCTION idem_sql_refused(tenant text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
	SELECT CASE WHEN tenant IS NULL THEN 'permission denied for idem tenants'
				ELSE format('permission denied for idem tenant "%s"', tenant) END
$$;

/*
 * The restriction on this call, as src/tenant.c's current_restriction
 * computes it: the bindings of the session user, of the role of SET ROLE,
 * and of role (the current user of the API function), each bound by its
 * own binding and by those of the roles whose privileges it has, a
 * superuser by its own only.  bound is NULL when none is bound, and by_role
 * names the role whose binding decided.  Errors (42501) for bindings to two
 * tenants, or for an unbound call while idem.require_binding is on; tenant,
 * if not NULL, names what the caller asked for, for the message.
 */
CREATE FUNCTION idem_sql_restriction(role oid, tenant text,
									 OUT bound text, OUT by_role oid)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	actors		oid[];
	actor		oid;
	tenants		text[];
BEGIN
	/* a call without a ticket (idem_sql_caller): only where nothing binds */
	IF role IS NULL THEN
		IF EXISTS (SELECT FROM idem_binding) OR idem_sql_require_binding() THEN
			RAISE EXCEPTION 'permission denied: idem call without a ticket of its caller'
				USING ERRCODE = 'insufficient_privilege',
					  DETAIL = 'A tenant binding or idem.require_binding holds, so the call must name its caller.',
					  HINT = 'Call idem''s API functions; a call that met a binding made while it ran may be retried.';
		END IF;
		RETURN;
	END IF;
	/* no binding at all, as in a database of one tenant: nothing to join */
	IF EXISTS (SELECT FROM idem_binding) THEN
		actors := ARRAY[(SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user),
						CASE current_setting('role')
							WHEN 'none' THEN NULL
							ELSE to_regrole(quote_ident(current_setting('role')))::oid
						END,
						role];
		FOR i IN 1 .. 3 LOOP
			actor := actors[i];
			CONTINUE WHEN actor IS NULL OR (i > 1 AND actor = actors[i - 1]) OR
				(i = 3 AND actor = actors[1]);
			SELECT array_agg(DISTINCT b.tenant ORDER BY b.tenant) INTO tenants
			  FROM idem_binding b
			 WHERE b.role::oid = actor
				OR (NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.oid = actor), false)
					AND pg_has_role(actor, b.role::oid, 'USAGE'));
			CONTINUE WHEN tenants IS NULL;
			IF cardinality(tenants) > 1 THEN
				RAISE EXCEPTION '%', idem_sql_refused(tenant)
					USING ERRCODE = 'insufficient_privilege',
						  DETAIL = format('Role "%s" is bound to idem tenants "%s" and "%s", through the roles whose privileges it has.',
										  idem_sql_role_name(actor), tenants[1], tenants[2]);
			END IF;
			IF bound IS NOT NULL AND bound <> tenants[1] THEN
				RAISE EXCEPTION '%', idem_sql_refused(tenant)
					USING ERRCODE = 'insufficient_privilege',
						  DETAIL = format('This call acts as role "%s", bound to idem tenant "%s", and as role "%s", bound to idem tenant "%s".',
										  idem_sql_role_name(by_role), bound,
										  idem_sql_role_name(actor), tenants[1]);
			END IF;
			bound := tenants[1];
			by_role := actor;
		END LOOP;
	END IF;
	IF bound IS NULL AND idem_sql_require_binding() AND
	   NOT idem_sql_is_admin(role) THEN
		RAISE EXCEPTION '%', idem_sql_refused(tenant)
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Role "%s" is bound to no idem tenant, and idem.require_binding is on.',
								  idem_sql_role_name(role));
	END IF;
END
$$;

/* A role's name, or its OID when it was dropped */
CREATE FUNCTION idem_sql_role_name(role oid)
RETURNS text
LANGUAGE sql STABLE
AS $$
	SELECT coalesce((SELECT r.rolname::text FROM pg_roles r WHERE r.oid = role), role::text)
$$;

/* The tenant this call is bound to (idem_sql_restriction), NULL for none */
CREATE FUNCTION idem_sql_bound_tenant(role oid, tenant text DEFAULT NULL)
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
	SELECT (idem_sql_restriction(role, tenant)).bound
$$;

/* Refuse a tenant that the roles of this call may not touch (42501) */
CREATE FUNCTION idem_sql_check_tenant(role oid, tenant text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	r			record := idem_sql_restriction(role, tenant);
BEGIN
	IF r.bound IS NOT NULL AND r.bound <> tenant COLLATE "C" THEN
		RAISE EXCEPTION 'permission denied for idem tenant "%"', tenant
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Role "%s" is bound to idem tenant "%s".',
								  idem_sql_role_name(r.by_role), r.bound);
	END IF;
END
$$;

/*
 * An array with its elements from subscript 1: the C edition walks a
 * batch's arrays element by element whatever their bounds, and the SQL
 * edition's batches subscript them from 1 (a slice always starts there)
 */
CREATE FUNCTION idem_sql_rebased(arr anyarray)
RETURNS anyarray
LANGUAGE sql IMMUTABLE
AS $$
	SELECT CASE WHEN array_lower(arr, 1) <> 1
		   THEN arr[array_lower(arr, 1):array_upper(arr, 1)] ELSE arr END
$$;

/* The C edition's checks of a name argument: NULL, empty, too long */
CREATE FUNCTION idem_sql_check_name(what text, value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	clipped		text;
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF value = '' THEN
		RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF octet_length(value) > 255 THEN
		/* the first 32 bytes that end a character, as pg_mbcliplen cuts */
		clipped := left(value, 32);
		WHILE octet_length(clipped) > 32 LOOP
			clipped := left(clipped, -1);
		END LOOP;
		RAISE EXCEPTION '% "%..." is too long', what, clipped
			USING ERRCODE = 'string_data_right_truncation',
				  DETAIL = format('The %s is %s bytes long; the limit is 255 bytes.',
								  what, octet_length(value));
	END IF;
END
$$;

/*
 * The C edition's check of the size in bytes of a body, payload or error
 * against idem.max_body_size (limit_bytes); NULL (none) passes
 */
CREATE FUNCTION idem_sql_check_size(what text, bytes integer, limit_bytes bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF bytes > limit_bytes THEN
		RAISE EXCEPTION '% of % bytes is larger than idem.max_body_size', what, bytes
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = format('idem.max_body_size is %s bytes.', limit_bytes);
	END IF;
END
$$;

/* Claims, finishes and takes are decisions: only on the primary */
CREATE FUNCTION idem_sql_require_primary(function text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	PERFORM idem_sql_require_primary_of(function, 'idem_record');
END
$$;

/*
 * The same for a call on table (idem_record, idem_outbox): refused on a
 * standby and on a subscriber that receives table
 */
CREATE FUNCTION idem_sql_require_primary_of(function text, "table" text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	sub			name;
BEGIN
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'cannot call % during recovery', function
			USING ERRCODE = 'read_only_sql_transaction',
				  HINT = 'Idempotency decisions need the primary server: connect to it.';
	END IF;
	IF EXISTS (SELECT FROM pg_subscription_rel sr
				WHERE sr.srrelid = to_regclass("table")) THEN
		SELECT s.subname INTO sub
		  FROM pg_subscription_rel sr JOIN pg_subscription s ON s.oid = sr.srsubid
		 WHERE sr.srrelid = to_regclass("table")
		 LIMIT 1;
		RAISE EXCEPTION 'cannot call % on a logical replication subscriber of table "%"', function, "table"
			USING ERRCODE = 'read_only_sql_transaction',
				  DETAIL = format('Subscription "%s" replicates %s into this database; a decision taken here would conflict with the publisher''s.', sub, "table"),
				  HINT = format('Idempotency decisions need the publisher of subscription "%s": connect to it.', sub);
	END IF;
	/* PreventCommandIfReadOnly's message */
	IF current_setting('transaction_read_only')::boolean THEN
		RAISE EXCEPTION 'cannot execute % in a read-only transaction', function
			USING ERRCODE = 'read_only_sql_transaction';
	END IF;
END
$$;

/*
 * A time setting's value as SHOW shows the C edition's GUC: in the largest
 * unit that divides it (d, h, min, s, and ms for a setting in ms), a bare
 * number for 0.
 */
CREATE FUNCTION idem_sql_show(value interval, unit text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
	SELECT CASE WHEN n <= 0 THEN n::text
				ELSE (SELECT ((n * base) / u.ms_per)::bigint || u.name
						FROM (VALUES (1, 'd', 86400000::numeric), (2, 'h', 3600000),
									 (3, 'min', 60000), (4, 's', 1000), (5, 'ms', 1))
							 AS u(o, name, ms_per)
					   WHERE (n * base) % u.ms_per = 0 AND u.ms_per >= base
					   ORDER BY u.o LIMIT 1) END
	  FROM (SELECT CASE unit WHEN 'ms' THEN 1 ELSE 1000 END AS base) b,
		   LATERAL (SELECT round(extract(epoch FROM value) * 1000 / b.base) AS n) v
$$;

/*
 * A DBA's cap (idem.max_lease, idem.max_retention, as idem_sql_cap reads
 * them; 0: none) on a span that who (a claim, a take, an enqueue) asks for
 * by its argument given, or else by the setting named: src/protocol.c's
 * protocol_check_cap, with its message.
 */
CREATE FUNCTION idem_sql_check_cap(who text, what text, span interval,
								   cap interval, cap_setting text, cap_unit text,
								   given interval, setting text, value interval,
								   unit text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF cap > '0' AND span > cap THEN
		RAISE EXCEPTION '% % is longer than % (%)', what,
			coalesce(given::text, idem_sql_show(value, unit)),
			cap_setting, idem_sql_show(cap, cap_unit)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = CASE WHEN given IS NOT NULL
								THEN format('The %s''s %s argument asks for it.', who, what)
								ELSE format('The setting %s asks for it.', setting) END,
				  HINT = format('Ask for a shorter %s, or have a superuser raise %s.',
								what, cap_setting);
	END IF;
END
$$;

/*
 * Refuse a span (a claim's lease, retention or wait_timeout: name) that
 * takes now out of timestamptz's range, as src/protocol.c's
 * protocol_time_plus does (22023, where the sum itself would raise 22008):
 * the sum is estimated after each step of the addition (months, counted as
 * a twelfth of a Julian year, then days, then the time), with a margin of a
 * century.
 */
CREATE FUNCTION idem_sql_time_plus(now timestamptz, span interval, name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	margin		float8 := 100 * 365.25 * 86400;
	sum			float8 := extract(epoch FROM now);
	steps		float8[];
BEGIN
	IF span::text IN ('infinity', '-infinity') THEN
		RETURN;
	END IF;
	steps := ARRAY[(extract(year FROM span) * 12 + extract(month FROM span)) * (365.25 / 12) * 86400,
				   extract(day FROM span) * 86400,
				   extract(hour FROM span) * 3600 + extract(minute FROM span) * 60 +
				   extract(second FROM span)];
	FOR i IN 1 .. 3 LOOP
		sum := sum + steps[i];
		/* timestamptz's range, in seconds from 1970 */
		IF sum < -210866803200 + margin OR sum > 9224318016000 - margin THEN
			RAISE EXCEPTION '% % is out of range', name, span
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Added to the current time, it leaves the range of timestamp with time zone.';
		END IF;
	END LOOP;
END
$$;

/*
 * The end of a lease that who (a claim, a take) takes at now: its lease
 * argument, or idem.lease (setting); an error for one that is not
 * positive or is over idem.max_lease (max_lease; 0: none), as
 * src/protocol.c's protocol_lease_end.
 */
CREATE FUNCTION idem_sql_lease_end(who text, now timestamptz, lease interval,
								   setting interval, max_lease interval)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	lease_end	timestamptz;
BEGIN
	IF lease IS NOT NULL THEN
		PERFORM idem_sql_time_plus(now, lease, 'lease');
	END IF;
	lease_end := now + coalesce(lease, setting);
	IF lease_end <= now THEN
		RAISE EXCEPTION 'lease must be positive'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The lease given was %s.', lease);
	END IF;
	IF max_lease > '0' THEN
		PERFORM idem_sql_check_cap(who, 'lease', lease_end - now, max_lease,
								   'idem.max_lease', 'ms', lease, 'idem.lease',
								   setting, 'ms');
	END IF;
	RETURN lease_end;
END
$$;

/*
 * Whether a claim's times pass their checks (idem_sql_claim_times) without
 * being computed: no lease or retention given, and idem.lease,
 * idem.retention, idem.retry_window and the caps' session values unset or
 * at their defaults as the C edition shows them (a server may load its
 * library).  The caps' rows of idem_setting are the caller's to look at.  Simple expressions only:
 * run without the executor.
 */
CREATE FUNCTION idem_sql_default_times(lease interval, retention interval)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	RETURN lease IS NULL AND retention IS NULL AND
		coalesce(nullif(current_setting('idem.lease', true), ''), '5min') = '5min' AND
		coalesce(nullif(current_setting('idem.retention', true), ''), '1d') = '1d' AND
		coalesce(nullif(current_setting('idem.retry_window', true), ''), '1h') = '1h' AND
		coalesce(nullif(current_setting('idem.max_lease', true), ''), '0') = '0' AND
		coalesce(nullif(current_setting('idem.max_retention', true), ''), '0') = '0';
END
$$;

/*
 * The lease's end and the expiry of a claim made at now where
 * idem_sql_default_times holds: idem.lease's and idem.retention's
 * defaults, which it compares the settings with (the retention rule and
 * the caps then hold).  SQL, inlined into the caller's expression (STABLE,
 * as timestamptz arithmetic is: an IMMUTABLE one would not be).
 */
CREATE FUNCTION idem_sql_default_lease_end(now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$ SELECT now + interval '5 min' $$;

CREATE FUNCTION idem_sql_default_expiry(now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$ SELECT now + interval '24 hours' $$;

/*
 * The lease's end and the expiry of a claim made at now (the C edition's
 * claim_times): errors for a bad lease or retention, for one over the caps
 * of idem_setting, and while idem.retry_window is not shorter than
 * idem.retention (the C edition refuses the SET that would break that
 * rule; a setting any role may SET is only seen here).  capped false: the
 * caller saw that no cap is set (idem_sql_default_times, and no cap row in
 * idem_setting), which is then not read again.
 */
CREATE FUNCTION idem_sql_claim_times(now timestamptz, lease interval,
									 retention interval, capped boolean,
									 OUT lease_expires_at timestamptz,
									 OUT expires_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	s_retry_window interval := idem_sql_time(idem_sql_guc('idem.retry_window', '1h'), 's');
	s_keep		interval := idem_sql_time(idem_sql_guc('idem.retention', '24h'), 's');
	s_lease		interval := idem_sql_time(idem_sql_guc('idem.lease', '5min'), 'ms');
	s_max_keep	interval := '0';
	s_max_lease	interval := '0';
BEGIN
	IF capped THEN
		s_max_keep := idem_sql_cap('idem.max_retention', 's');
		s_max_lease := idem_sql_cap('idem.max_lease', 'ms');
	END IF;
	IF s_retry_window >= s_keep THEN
		RAISE EXCEPTION 'idem.retention (%s) must be longer than idem.retry_window (%s)',
			extract(epoch FROM s_keep)::bigint, extract(epoch FROM s_retry_window)::bigint
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A retry that arrives after its record expired would execute the request again.',
				  HINT = 'Raise idem.retention or lower idem.retry_window.';
	END IF;
	lease_expires_at := idem_sql_lease_end('claim', now, lease, s_lease, s_max_lease);
	IF s_max_keep > '0' THEN
		PERFORM idem_sql_check_cap('claim', 'lease', lease_expires_at - now, s_max_keep,
								   'idem.max_retention', 's', lease, 'idem.lease',
								   s_lease, 'ms');
	END IF;
	IF retention IS NOT NULL THEN
		PERFORM idem_sql_time_plus(now, retention, 'retention');
		IF now + retention = '-infinity' OR
		   (now + retention <> 'infinity' AND (now + retention) - now <= s_retry_window) THEN
			RAISE EXCEPTION 'retention % must be longer than idem.retry_window (%s)',
				retention, extract(epoch FROM s_retry_window)::bigint
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'A retry that arrives after its record expired would execute the request again.';
		END IF;
	END IF;
	expires_at := now + coalesce(retention, s_keep);
	IF s_max_keep > '0' THEN
		PERFORM idem_sql_check_cap('claim', 'retention', expires_at - now, s_max_keep,
								   'idem.max_retention', 's', retention, 'idem.retention',
								   s_keep, 's');
	END IF;
	expires_at := greatest(expires_at, lease_expires_at);
END
$$;

/*
 * How many keys' advisory locks one transaction takes for its claims (see
 * the head of edition.sql): a transaction's share of the lock table
 * (max_locks_per_transaction's default), so that no transaction's claims
 * exhaust the lock table that every session shares.
 */
CREATE FUNCTION idem_sql_claim_locks()
RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$ SELECT 64 $$;

/*
 * The advisory lock that a claim of the key holds until its transaction
 * ends.  PL/pgSQL, whose plan lives for the session: a SQL function that
 * reads a table is planned at every call.
 */
CREATE FUNCTION idem_sql_claim_lock_id(tenant text, endpoint text, key text)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	salt		bigint;
BEGIN
	SELECT s.lock_salt INTO salt FROM idem_sql_secret s;
	RETURN hashtextextended(tenant || chr(1) || endpoint || chr(1) || key, salt);
END
$$;

/*
 * Whether another transaction holds the key's claim lock: a claim of the key
 * that has not committed, which a snapshot cannot see.  The lock is tried in
 * share mode, which another probe's does not conflict with, in a
 * subtransaction that is rolled back at once: the caller never holds it,
 * whatever interrupts it.  (A claim that tries the key's lock in the instant
 * a probe holds it answers in_progress, as for a claim.  A transaction over
 * its share of claim locks, idem_sql_claim_locks(), and a batch's claims
 * take none: those are not seen here.)
 */
CREATE FUNCTION idem_sql_claim_held(tenant text, endpoint text, key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	held		boolean;
BEGIN
	BEGIN
		held := NOT pg_try_advisory_xact_lock_shared(idem_sql_claim_lock_id(tenant, endpoint, key));
		RAISE SQLSTATE 'IW001';
	EXCEPTION
		WHEN SQLSTATE 'IW001' THEN
			NULL;
	END;
	RETURN held;
END
$$;

/*
 * Wait for a transaction that writes the key's record (one finishing a
 * committed pending claim, say) as for a lock, which lock_timeout bounds,
 * the deadlock detector sees, and isolationtester sees waiting: the C
 * edition waits for it so.  The row lock is taken in a subtransaction that
 * is rolled back at once, so that it is not held: the finish that a
 * waiter's lock would block is what the waiter waits for.  A row that no
 * transaction has written or locked since its insert (xmax 0: its claimer
 * still running the request) is not locked at all, nor one whose xmax is
 * the one this waiter's last lock left (waited): the caller looks again
 * later, and locks only when another transaction has written or locked the
 * row since.  Returns the xmax to pass as waited next time.
 */
CREATE FUNCTION idem_sql_wait_writer(tenant text, endpoint text, key text,
									 waited xid)
RETURNS xid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	writer		xid := (SELECT x.xmax FROM idem_record x
						 WHERE x.tenant = idem_sql_wait_writer.tenant
						   AND x.endpoint = idem_sql_wait_writer.endpoint
						   AND x.key = idem_sql_wait_writer.key);
BEGIN
	IF writer IS NULL OR writer = '0'::xid OR writer = waited THEN
		RETURN waited;
	END IF;
	BEGIN
		PERFORM FROM idem_record x
		 WHERE x.tenant = idem_sql_wait_writer.tenant
		   AND x.endpoint = idem_sql_wait_writer.endpoint
		   AND x.key = idem_sql_wait_writer.key
		   FOR SHARE;
		RAISE SQLSTATE 'IW001';
	EXCEPTION
		WHEN SQLSTATE 'IW001' THEN
			NULL;
	END;
	/* the xmax this lock left (its own aborted one): not locked on again */
	RETURN (SELECT x.xmax FROM idem_record x
			 WHERE x.tenant = idem_sql_wait_writer.tenant
			   AND x.endpoint = idem_sql_wait_writer.endpoint
			   AND x.key = idem_sql_wait_writer.key);
END
$$;

/*
 * Take the key's claim lock if this transaction may still take one: true
 * when it holds it now, or took none (over its share); false when another
 * transaction holds it (an uncommitted claim of the key).
 */
CREATE FUNCTION idem_sql_claim_lock(tenant text, endpoint text, key text,
									wait boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	taken		integer := coalesce(nullif(current_setting('idem_sql.claim_locks', true), ''), '0')::integer;
	id			bigint;
BEGIN
	IF taken >= idem_sql_claim_locks() THEN
		RETURN true;
	END IF;
	id := idem_sql_claim_lock_id(tenant, endpoint, key);
	IF NOT pg_try_advisory_xact_lock(id) THEN
		IF NOT wait THEN
			RETURN false;
		END IF;
		PERFORM pg_advisory_xact_lock(id);
	END IF;
	PERFORM set_config('idem_sql.claim_locks', (taken + 1)::text, true);
	RETURN true;
END
$$;

/* Whether a record is forgotten: expired, unless a pending claim's lease runs */
CREATE FUNCTION idem_sql_expired(r idem_record, now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
	SELECT r.expires_at <= now AND NOT (r.state = 'pending' AND r.lease_expires_at > now)
$$;

/*
 * A claim's wait for a committed pending claim fails as in a deadlock
 * (40P01) when another process waits for a lock this transaction holds:
 * the owner may need it to finish the claim, and no deadlock detector sees
 * that cycle (src/wait.c's blocked_by_me).  A wait for this backend's
 * virtual transaction is left out: CREATE INDEX CONCURRENTLY and its kin
 * wait so for every older transaction.
 */
CREATE FUNCTION idem_sql_blocked_by_me(tenant text, endpoint text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	blocked		integer;
BEGIN
	SELECT l.pid INTO blocked
	  FROM pg_locks l
	 WHERE NOT l.granted AND l.pid <> pg_backend_pid()
	   AND l.locktype <> 'virtualxid'
	   AND EXISTS (SELECT FROM pg_locks m
				   WHERE m.pid = pg_backend_pid() AND m.granted
					 AND (m.locktype, m.database, m.relation, m.page, m.tuple,
						  m.virtualxid, m.transactionid, m.classid, m.objid,
						  m.objsubid)
						 IS NOT DISTINCT FROM
						 (l.locktype, l.database, l.relation, l.page, l.tuple,
						  l.virtualxid, l.transactionid, l.classid, l.objid,
						  l.objsubid))
	   AND pg_backend_pid() = ANY (pg_blocking_pids(l.pid))
	 LIMIT 1;
	IF blocked IS NOT NULL THEN
		RAISE EXCEPTION 'deadlock detected'
			USING ERRCODE = 'deadlock_detected',
				  DETAIL = format('Process %s waits for the committed pending claim of idem key "%s" of endpoint "%s" (tenant "%s") to be finished; process %s waits for a lock that process %s holds.',
								  pg_backend_pid(), key, endpoint, tenant, blocked, pg_backend_pid()),
				  HINT = 'The claim''s owner may need that lock to finish it. Take a claim''s wait before the locks of the work it guards, or wait without holding locks.';
	END IF;
END
$$;

/*
 * Claim a key (the C edition's protocol_claim, in PL/pgSQL): a finished
 * record replays from the snapshot without locking; otherwise the key's
 * claim lock, then the record locked (SKIP LOCKED: one that another
 * transaction is writing answers in_progress) or inserted, the unique index
 * deciding between two inserts.  An element of a batch (batch) takes no
 * claim lock, so that a batch of 100,000 keys holds no lock per key: its
 * insert waits for another transaction's uncommitted claim of the key.
 */
CREATE FUNCTION idem_sql_decide_claim(role oid, tenant text, endpoint text, key text,
							   digest bytea, wait boolean, lease interval,
							   retention interval, wait_timeout interval,
							   batch boolean,
							   OUT outcome text, OUT status integer,
							   OUT body bytea, OUT headers jsonb,
							   OUT attempt integer,
							   OUT created_at timestamptz,
							   OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
	now			timestamptz := clock_timestamp();
	deadline	timestamptz := 'infinity';
	t			record;
	r			idem_record;
	snap		idem_record;
	seen		boolean;
	last		boolean := false;
	waited		xid;
	have_snap	boolean;
	own			boolean;
	lock_deadline timestamptz;
	deadlock_check timestamptz;
	capped		boolean;
	c			record;
BEGIN
	/* one simple expression for the names that pass, the checks for the rest */
	IF coalesce(tenant = '' OR octet_length(tenant) > 255 OR
				endpoint = '' OR octet_length(endpoint) > 255 OR
				key = '' OR octet_length(key) > 255, true) THEN
		PERFORM idem_sql_check_name('tenant', tenant);
		PERFORM idem_sql_check_name('endpoint', endpoint);
		PERFORM idem_sql_check_name('key', key);
	END IF;
	IF wait IS NULL THEN
		RAISE EXCEPTION 'wait must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF wait_timeout IS NOT NULL AND NOT wait THEN
		RAISE EXCEPTION 'wait_timeout needs wait => true'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A claim that does not wait answers in_progress at once.';
	END IF;
	PERFORM idem_sql_check_tenant(role, tenant);
	PERFORM idem_sql_require_primary('idem_claim()');
	/*
	 * The intervals and the retention rule are checked before anything is
	 * looked at, as src/protocol.c's claim checks them: a replay refuses
	 * the arguments a claim would refuse.  The times are taken again where
	 * the claim writes; here they are not computed where they cannot fail.
	 */
	capped := NOT (idem_sql_default_times(lease, retention) AND
				   idem_sql_setting('idem.max_lease', NULL) IS NULL AND
				   idem_sql_setting('idem.max_retention', NULL) IS NULL);
	IF capped THEN
		PERFORM idem_sql_claim_times(now, lease, retention, capped);
	END IF;
	IF wait_timeout IS NOT NULL THEN
		PERFORM idem_sql_time_plus(now, wait_timeout, 'wait_timeout');
		IF wait_timeout < '0' THEN
			RAISE EXCEPTION 'wait_timeout must not be negative'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('The wait_timeout given was %s.', wait_timeout);
		END IF;
		deadline := now + wait_timeout;
	END IF;
	LOOP
		now := clock_timestamp();
		SELECT * INTO snap FROM idem_record x
		 WHERE x.tenant = idem_sql_decide_claim.tenant AND x.endpoint = idem_sql_decide_claim.endpoint
		   AND x.key = idem_sql_decide_claim.key;
		seen := FOUND;
		have_snap := seen AND NOT idem_sql_expired(snap, now);
		IF have_snap AND (snap.fingerprint IS DISTINCT FROM digest AND snap.fingerprint IS NOT NULL AND digest IS NOT NULL) THEN
			outcome := 'mismatch';
		ELSIF have_snap AND (snap.state = 'succeeded' OR (snap.state = 'failed' AND NOT snap.retryable)) THEN
			outcome := 'replay';
		ELSIF have_snap AND snap.state = 'pending' AND snap.lease_expires_at > now THEN
			own := snap.claimed_at >= now() AND idem_sql_own((SELECT x.xmin FROM idem_record x
								 WHERE x.tenant = idem_sql_decide_claim.tenant
								   AND x.endpoint = idem_sql_decide_claim.endpoint
								   AND x.key = idem_sql_decide_claim.key));
			IF wait AND NOT coalesce(own, false) AND NOT last THEN
				/*
				 * A committed pending claim: wait for a transaction that is
				 * finishing it, whatever wait_timeout (as the C edition
				 * does); then look again, in 10 ms while wait_timeout runs,
				 * or once more at once when it has run out.  Those looks
				 * are no lock wait, so they end as src/wait.c ends its
				 * sleeps: at lock_timeout from the first, and with a
				 * deadlock's error when, after each deadlock_timeout,
				 * another process waits for a lock this transaction holds
				 * (the owner may need it to finish the claim)
				 */
				waited := idem_sql_wait_writer(tenant, endpoint, key, waited);
				now := clock_timestamp();
				/* wait_timeout has run out: one more look, as C, no checks */
				IF now >= deadline THEN
					last := true;
					CONTINUE;
				END IF;
				IF lock_deadline IS NULL THEN
					lock_deadline := CASE WHEN current_setting('lock_timeout')::interval > '0'
										  THEN now + current_setting('lock_timeout')::interval
										  ELSE 'infinity' END;
					deadlock_check := now + current_setting('deadlock_timeout')::interval;
				END IF;
				IF now >= deadlock_check THEN
					PERFORM idem_sql_blocked_by_me(tenant, endpoint, key);
					deadlock_check := now + current_setting('deadlock_timeout')::interval;
				END IF;
				IF now >= lock_deadline THEN
					RAISE EXCEPTION 'canceling statement due to lock timeout'
						USING ERRCODE = 'lock_not_available',
							  DETAIL = format('The committed pending claim of idem key "%s" of endpoint "%s" (tenant "%s") was not finished within lock_timeout.',
											  key, endpoint, tenant);
				END IF;
				PERFORM pg_sleep(least(0.01, extract(epoch FROM
					least(lock_deadline, deadlock_check, deadline, snap.lease_expires_at) - now)));
				CONTINUE;
			END IF;
			outcome := 'in_progress';
		END IF;
		IF outcome IS NOT NULL THEN
			status := snap.status; body := snap.body; headers := snap.headers;
			attempt := snap.attempt; created_at := snap.created_at;
			expires_at := snap.expires_at;
			RETURN;
		END IF;

		IF NOT batch AND NOT idem_sql_claim_lock(tenant, endpoint, key, wait) THEN
			outcome := 'in_progress';
			IF have_snap THEN
				status := snap.status; body := snap.body; headers := snap.headers;
				attempt := snap.attempt; created_at := snap.created_at;
				expires_at := snap.expires_at;
			END IF;
			RETURN;
		END IF;
		now := clock_timestamp();
		t := idem_sql_claim_times(now, lease, retention, capped);
		SELECT * INTO r FROM idem_record x
		 WHERE x.tenant = idem_sql_decide_claim.tenant AND x.endpoint = idem_sql_decide_claim.endpoint
		   AND x.key = idem_sql_decide_claim.key
		   FOR UPDATE SKIP LOCKED;
		IF NOT FOUND THEN
			/*
			 * A record that is still there was skipped: another transaction
			 * locks it (a purge deleting it, say), and the insert would wait
			 * for that transaction's end, which a claim that does not wait
			 * must not
			 */
			IF seen AND NOT wait THEN
				PERFORM FROM idem_record x
				 WHERE x.tenant = idem_sql_decide_claim.tenant
				   AND x.endpoint = idem_sql_decide_claim.endpoint
				   AND x.key = idem_sql_decide_claim.key;
				IF FOUND THEN
					outcome := 'in_progress';
					IF have_snap THEN
						status := snap.status; body := snap.body; headers := snap.headers;
						attempt := snap.attempt; created_at := snap.created_at;
						expires_at := snap.expires_at;
					END IF;
					RETURN;
				END IF;
			END IF;
			PERFORM idem_sql_freeze_seen();
			IF idem_sql_frozen(tenant, endpoint, now) THEN
				outcome := 'frozen';
				RETURN;
			END IF;
			c := idem_sql_insert_claim(tenant, endpoint, key, digest, now,
									   t.lease_expires_at, t.expires_at, seen,
									   lease, retention, capped);
			IF c.attempt IS NOT NULL THEN
				outcome := 'claimed';
				attempt := c.attempt;
				created_at := c.created_at;
				expires_at := c.expires_at;
				RETURN;
			END IF;
			/* the record is there, and another transaction writes it */
			IF NOT wait THEN
				outcome := 'in_progress';
				RETURN;
			END IF;
			SELECT * INTO r FROM idem_record x
			 WHERE x.tenant = idem_sql_decide_claim.tenant AND x.endpoint = idem_sql_decide_claim.endpoint
			   AND x.key = idem_sql_decide_claim.key
			   FOR UPDATE;
			CONTINUE WHEN NOT FOUND;
			/* the claim is made after that wait */
			now := clock_timestamp();
			t := idem_sql_claim_times(now, lease, retention, capped);
		END IF;

		/* r is locked: re-claim it, or answer what it holds */
		IF idem_sql_expired(r, now) OR
		   (r.state = 'failed' AND r.retryable AND
			NOT (r.fingerprint IS NOT NULL AND digest IS NOT NULL AND r.fingerprint <> digest)) THEN
			PERFORM idem_sql_freeze_seen();
			IF idem_sql_frozen(tenant, endpoint, now) THEN
				outcome := 'frozen';
				RETURN;
			END IF;
			UPDATE idem_record x
			   SET state = 'pending', retryable = false, status = NULL,
				   body = NULL, headers = NULL, attempt = r.attempt + 1,
				   fingerprint = CASE WHEN idem_sql_expired(r, now) OR r.fingerprint IS NULL
									  THEN digest ELSE r.fingerprint END,
				   created_at = CASE WHEN idem_sql_expired(r, now) THEN now ELSE r.created_at END,
				   claimed_at = now, lease_expires_at = t.lease_expires_at,
				   finished_at = NULL, expires_at = t.expires_at,
				   trace = nullif(current_setting('idem.trace', true), '')
			 WHERE x.tenant = idem_sql_decide_claim.tenant AND x.endpoint = idem_sql_decide_claim.endpoint
			   AND x.key = idem_sql_decide_claim.key
			RETURNING x.attempt, x.created_at, x.expires_at
				 INTO attempt, created_at, expires_at;
			outcome := 'claimed';
			RETURN;
		END IF;
		outcome := CASE
			WHEN r.fingerprint IS NOT NULL AND digest IS NOT NULL AND r.fingerprint <> digest THEN 'mismatch'
			WHEN r.state <> 'pending' THEN 'replay'
			WHEN r.lease_expires_at > now THEN 'in_progress'
			ELSE 'unknown' END;
		status := r.status; body := r.body; headers := r.headers;
		attempt := r.attempt; created_at := r.created_at; expires_at := r.expires_at;
		RETURN;
	END LOOP;
END
$$;

/* A claim's decision and its log line (idem.log_outcomes), as role */
CREATE FUNCTION idem_sql_claim_as(role oid, tenant text, endpoint text, key text,
							   digest bytea, wait boolean, lease interval,
							   retention interval, wait_timeout interval,
							   batch boolean,
							   OUT outcome text, OUT status integer,
							   OUT body bytea, OUT headers jsonb,
							   OUT attempt integer,
							   OUT created_at timestamptz,
							   OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	c			record;
BEGIN
	c := idem_sql_decide_claim(role, tenant, endpoint, key, digest, wait, lease,
							   retention, wait_timeout, batch);
	outcome := c.outcome; attempt := c.attempt; created_at := c.created_at;
	expires_at := c.expires_at;
	/* only a replay answers the stored response (src/protocol.c) */
	IF outcome = 'replay' THEN
		status := c.status; body := c.body; headers := c.headers;
	END IF;
	PERFORM idem_sql_log('claim', tenant, 'endpoint', endpoint, key,
						 format('outcome=%s attempt=%s', outcome, attempt),
						 outcome IN ('in_progress', 'mismatch', 'unknown', 'frozen'));
END
$$;

/*
 * One LOG line per decision, as src/decisions.c writes it:
 *   idem claim: tenant="acme" endpoint="POST /v1/orders" key="k-42" outcome=replay attempt=1 trace="t-1"
 * when idem.log_outcomes (of idem_setting) is on, or is conflicts and the
 * decision tells of a duplicate or a conflict.  The quoted values are
 * escaped so that no key can end its field or forge a line.
 */
CREATE FUNCTION idem_sql_log(decision text, tenant text, scope text,
							 scope_value text, key text, fields text,
							 conflict boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	mode		text := idem_sql_log_outcomes();
BEGIN
	IF mode = 'on' OR (mode = 'conflicts' AND conflict) THEN
		RAISE LOG '%', format('idem %s: tenant=%s %s=%s key=%s %s trace=%s', decision,
							  idem_sql_quote(tenant), scope, idem_sql_quote(scope_value),
							  idem_sql_quote(key), fields,
							  idem_sql_quote(coalesce(current_setting('idem.trace', true), '')));
	END IF;
END
$$;

/* "value", a backslash before a quote or a backslash, \n and \xNN for control characters */
CREATE FUNCTION idem_sql_quote(value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	out			text := replace(replace(replace(value, '\', '\\'), '"', '\"'), E'\n', '\n');
	c			text;
BEGIN
	IF out ~ '[\x01-\x1f\x7f]' THEN
		FOR c IN SELECT DISTINCT m[1] FROM regexp_matches(out, '([\x01-\x1f\x7f])', 'g') m LOOP
			out := replace(out, c, format('\x%s', lpad(to_hex(ascii(c)), 2, '0')));
		END LOOP;
	END IF;
	RETURN '"' || out || '"';
END
$$;

/*
 * Whether a call handed ticket 0 may skip the checks that the whole way
 * makes (idem_sql_claim_as, idem_sql_finish_as): names that need no
 * check, no log line to write and a writable primary (with flags'
 * subscribed false).
 * Simple expressions only: run without the executor.
 */
CREATE FUNCTION idem_sql_plain_call(tenant text, endpoint text, key text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	RETURN NOT coalesce(tenant = '' OR octet_length(tenant) > 255 OR
						endpoint = '' OR octet_length(endpoint) > 255 OR
						key = '' OR octet_length(key) > 255, true) AND
		coalesce(nullif(current_setting('idem.log_outcomes', true), ''), 'off') = 'off' AND
		NOT pg_is_in_recovery() AND
		NOT current_setting('transaction_read_only')::boolean;
END
$$;

/*
 * Insert the pending record of a claim made at now, whose times are t (the
 * claim holds the key's claim lock, or is over its share of them; their
 * lease's end and expiry): its attempt, or NULL when a record of the key is there, which another
 * transaction writes (ON CONFLICT waited for it, if it was uncommitted).
 * seen: the claim saw a record of the key, which another transaction may
 * be deleting; an insert that waited for it takes the times again (the
 * lease and the retention start when the claim is made, as in the C
 * edition), from lease, retention and capped as idem_sql_claim_times
 * takes them.  The fencing floor is read before the insert and again,
 * locked, once it decided (a floor that moved after this transaction's
 * snapshot is then a serialization failure under REPEATABLE READ), and
 * the attempt starts above it.
 */
CREATE FUNCTION idem_sql_insert_claim(tenant text, endpoint text, key text,
									  digest bytea, now timestamptz,
									  lease_end timestamptz,
									  expiry timestamptz, seen boolean,
									  lease interval, retention interval,
									  capped boolean,
									  OUT attempt integer,
									  OUT created_at timestamptz,
									  OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
	inserting	timestamptz := clock_timestamp();
	floor		integer;
	t			record;
BEGIN
	INSERT INTO idem_record AS x (tenant, endpoint, key, state, fingerprint,
								  attempt, created_at, claimed_at,
								  lease_expires_at, expires_at, trace)
	VALUES (tenant, endpoint, key, 'pending', digest,
			coalesce((SELECT f.attempt FROM idem_attempt_floor f
					   WHERE f.bucket = hashtext(key) & 4095), 0) + 1,
			now, now, lease_end, expiry,
			nullif(current_setting('idem.trace', true), ''))
	ON CONFLICT (tenant, endpoint, key) DO NOTHING
	RETURNING x.attempt INTO attempt;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	created_at := now;
	expires_at := expiry;
	IF seen AND clock_timestamp() > inserting + interval '1 ms' THEN
		created_at := clock_timestamp();
		t := idem_sql_claim_times(created_at, lease, retention, capped);
		lease_end := t.lease_expires_at;
		expires_at := t.expires_at;
	ELSE
		inserting := NULL;
	END IF;
	SELECT f.attempt INTO floor
	  FROM idem_attempt_floor f
	 WHERE f.bucket = hashtext(key) & 4095
	   FOR KEY SHARE;
	IF floor >= attempt OR inserting IS NOT NULL THEN
		attempt := greatest(attempt, floor + 1);
		UPDATE idem_record x
		   SET attempt = idem_sql_insert_claim.attempt,
			   created_at = idem_sql_insert_claim.created_at,
			   claimed_at = idem_sql_insert_claim.created_at,
			   lease_expires_at = lease_end,
			   expires_at = idem_sql_insert_claim.expires_at
		 WHERE x.tenant = idem_sql_insert_claim.tenant
		   AND x.endpoint = idem_sql_insert_claim.endpoint
		   AND x.key = idem_sql_insert_claim.key;
	END IF;
END
$$;

/*
 * Claim a key for the role whose ticket this is (idem_sql_ticket()): the
 * entry of idem_claim.  idem_claim hands it ticket 0 first: where a
 * binding may decide (idem_sql_state) the answer has no outcome, and
 * idem_claim calls again with a ticket of its caller.  Where nothing
 * binds, the two commonest calls are answered here, from one read of the
 * key's record: the replay of a finished record and the claim of a key
 * that has none, for a plain call (idem_sql_plain_call) with no
 * wait_timeout, no lease or retention and the settings at their defaults
 * (idem_sql_default_times) and no setting row that a claim reads (so the
 * checks of the claim's times, which every claim makes first, pass, and
 * no log line is due).  The claim of a key with no record also needs
 * READ COMMITTED, the key's claim lock at once and no freeze; it inserts
 * as idem_sql_decide_claim would (idem_sql_insert_claim).  Every other call
 * goes through idem_sql_claim_as, without a ticket as a NULL one (which
 * refuses once a binding exists).  The calls of a claim cost more than
 * its reads and writes (doc/performance.md).
 */
CREATE FUNCTION idem_sql_claim(ticket bigint, tenant text, endpoint text,
							   key text, digest bytea, wait boolean,
							   lease interval, retention interval,
							   wait_timeout interval,
							   OUT outcome text, OUT status integer,
							   OUT body bytea, OUT headers jsonb,
							   OUT attempt integer,
							   OUT created_at timestamptz,
							   OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
	c			record;
	made		record;
	now			timestamptz;
BEGIN
	IF ticket = 0 THEN
		SELECT f.ticketed, f.subscribed, f.settings, x.state IS NOT NULL AS found,
			   x.state, x.retryable, x.fingerprint, x.status, x.body,
			   x.headers, x.attempt, x.created_at, x.expires_at,
			   x.expires_at > clock_timestamp() AS live
		  INTO c
		  FROM idem_sql_state f
		  LEFT JOIN idem_record x
			ON x.tenant = idem_sql_claim.tenant AND x.endpoint = idem_sql_claim.endpoint
		   AND x.key = idem_sql_claim.key;
		IF c.ticketed THEN
			RETURN;
		END IF;
		IF NOT c.subscribed AND NOT c.settings AND wait IS NOT NULL AND
		   wait_timeout IS NULL AND idem_sql_default_times(lease, retention) AND
		   idem_sql_plain_call(tenant, endpoint, key) THEN
			IF NOT c.found THEN
				/*
				 * Under READ COMMITTED, idem_sql_freeze_seen has nothing to
				 * do.  The freeze is looked at before the key's claim lock
				 * is taken: a claim that then goes the whole way takes the
				 * lock once (each take counts toward
				 * idem_sql_claim_locks(); one that meets a conflict below
				 * takes it again).
				 */
				now := clock_timestamp();
				IF current_setting('transaction_isolation') = 'read committed' AND
				   NOT idem_sql_frozen(tenant, endpoint, now) AND
				   idem_sql_claim_lock(tenant, endpoint, key, false) THEN
					made := idem_sql_insert_claim(tenant, endpoint, key, digest, now,
												  idem_sql_default_lease_end(now),
												  idem_sql_default_expiry(now),
												  false, NULL, NULL, false);
					IF made.attempt IS NOT NULL THEN
						outcome := 'claimed'; attempt := made.attempt;
						created_at := made.created_at; expires_at := made.expires_at;
						RETURN;
					END IF;
					/*
					 * Not inserted, and still no record to see: another
					 * transaction writes it (one over its share of claim
					 * locks), or a trigger kept the insert from being made.
					 * idem_sql_decide_claim answers so at this point; one
					 * that waits looks again.  A record committed since the
					 * read above (its claimer held the lock until then) is
					 * answered the whole way.
					 */
					IF NOT wait AND NOT EXISTS (SELECT FROM idem_record x
												 WHERE x.tenant = idem_sql_claim.tenant
												   AND x.endpoint = idem_sql_claim.endpoint
												   AND x.key = idem_sql_claim.key) THEN
						outcome := 'in_progress';
						RETURN;
					END IF;
				END IF;
			ELSIF c.live AND
				  (c.state = 'succeeded' OR (c.state = 'failed' AND NOT c.retryable)) AND
				  NOT (c.fingerprint <> digest) IS TRUE THEN
				outcome := 'replay'; status := c.status; body := c.body;
				headers := c.headers; attempt := c.attempt;
				created_at := c.created_at; expires_at := c.expires_at;
				RETURN;
			END IF;
		END IF;
		ticket := NULL;
	END IF;
	c := idem_sql_claim_as(idem_sql_as_caller(ticket), tenant, endpoint, key, digest,
						   wait, lease, retention, wait_timeout, false);
	outcome := c.outcome; status := c.status; body := c.body;
	headers := c.headers; attempt := c.attempt; created_at := c.created_at;
	expires_at := c.expires_at;
END
$$;

/*
 * Finish the key's pending claim for the role whose ticket this is.  The
 * API functions hand it ticket 0 first, as idem_claim hands it to
 * idem_sql_claim: NULL when a binding may decide (idem_sql_state), and
 * they call again with a ticket of their caller; otherwise the finish is
 * made without one, and for a plain call (idem_sql_plain_call) on a
 * primary that no subscription of idem_record feeds, without the checks
 * that only those can fail.
 */
CREATE FUNCTION idem_sql_finish(ticket bigint, how text, tenant text,
								endpoint text, key text, status integer,
								body bytea, attempt integer, headers jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	f			record;
BEGIN
	IF ticket = 0 THEN
		SELECT v.ticketed, v.subscribed INTO f FROM idem_sql_state v;
		IF f.ticketed THEN
			RETURN NULL;
		END IF;
		RETURN idem_sql_finish_as(NULL, how, tenant, endpoint, key, status, body,
								  attempt, headers,
								  NOT f.subscribed AND
								  idem_sql_plain_call(tenant, endpoint, key));
	END IF;
	RETURN idem_sql_finish_as(idem_sql_as_caller(ticket), how, tenant, endpoint, key,
							  status, body, attempt, headers, false);
END
$$;

/*
 * What idem_claim would answer, without claiming (idem_replay): no row when
 * a claim would execute
 */
CREATE FUNCTION idem_sql_replay(ticket bigint, tenant text, endpoint text, key text,
								digest bytea,
								OUT outcome text, OUT status integer,
								OUT body bytea, OUT headers jsonb,
								OUT attempt integer,
								OUT created_at timestamptz,
								OUT expires_at timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	now			timestamptz := clock_timestamp();
	r			idem_record;
BEGIN
	/* one simple expression for the names that pass, the checks for the rest */
	IF coalesce(tenant = '' OR octet_length(tenant) > 255 OR
				endpoint = '' OR octet_length(endpoint) > 255 OR
				key = '' OR octet_length(key) > 255, true) THEN
		PERFORM idem_sql_check_name('tenant', tenant);
		PERFORM idem_sql_check_name('endpoint', endpoint);
		PERFORM idem_sql_check_name('key', key);
	END IF;
	PERFORM idem_sql_check_tenant(role, tenant);
	IF (pg_is_in_recovery() OR EXISTS (SELECT FROM pg_subscription_rel sr
										WHERE sr.srrelid = 'idem_record'::regclass))
	   AND NOT idem_sql_guc('idem.standby_replay', 'off')::boolean THEN
		RAISE EXCEPTION 'cannot call idem_replay() during recovery'
			USING ERRCODE = 'read_only_sql_transaction',
				  DETAIL = 'A standby''s records may lag the primary''s.',
				  HINT = 'Ask the primary, or set idem.standby_replay to accept the lag.';
	END IF;
	SELECT * INTO r FROM idem_record x
	 WHERE x.tenant = idem_sql_replay.tenant AND x.endpoint = idem_sql_replay.endpoint
	   AND x.key = idem_sql_replay.key;
	IF NOT FOUND OR idem_sql_expired(r, now) OR
	   (r.state = 'failed' AND r.retryable AND
		NOT (r.fingerprint IS NOT NULL AND digest IS NOT NULL AND r.fingerprint <> digest)) THEN
		/* a claim would execute, unless another transaction's claim runs */
		IF idem_sql_claim_held(tenant, endpoint, key) THEN
			outcome := 'in_progress';
			RETURN NEXT;
		ELSIF idem_sql_frozen(tenant, endpoint, now) THEN
			outcome := 'frozen';
			RETURN NEXT;
		END IF;
		RETURN;
	END IF;
	outcome := CASE
		WHEN r.fingerprint IS NOT NULL AND digest IS NOT NULL AND r.fingerprint <> digest THEN 'mismatch'
		WHEN r.state <> 'pending' THEN 'replay'
		WHEN r.lease_expires_at > now THEN 'in_progress'
		ELSE 'unknown' END;
	/* only a replay answers the stored response (src/protocol.c) */
	IF outcome = 'replay' THEN
		status := r.status; body := r.body; headers := r.headers;
	END IF;
	attempt := r.attempt; created_at := r.created_at; expires_at := r.expires_at;
	RETURN NEXT;
END
$$;

/*
 * The arguments of a finish (how: complete, fail, fail_retryable, release;
 * NULL for a fail whose retryable is NULL), checked in src/api.c's order
 */
CREATE FUNCTION idem_sql_finish_check(how text, status integer, body bytea,
									  attempt integer, headers jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	limit_bytes	bigint;
	headers_bytes integer;
BEGIN
	/*
	 * one simple expression for a complete or fail whose status and attempt
	 * pass and that has no headers, the checks for the rest
	 */
	IF NOT coalesce(how IN ('complete', 'fail', 'fail_retryable') AND
					status BETWEEN 100 AND 599 AND NOT attempt < 1 IS TRUE AND
					headers IS NULL, false) THEN
		IF how IS DISTINCT FROM 'release' THEN
			IF status IS NULL THEN
				RAISE EXCEPTION 'status must not be null' USING ERRCODE = 'null_value_not_allowed';
			END IF;
			IF status NOT BETWEEN 100 AND 599 THEN
				RAISE EXCEPTION 'status % is not an HTTP status code', status
					USING ERRCODE = 'invalid_parameter_value',
						  DETAIL = 'A status must be between 100 and 599.';
			END IF;
			IF how IS NULL THEN
				RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = 'null_value_not_allowed';
			END IF;
		END IF;
		IF attempt IS NOT NULL AND attempt < 1 THEN
			RAISE EXCEPTION 'attempt % is not a valid attempt number', attempt
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Attempts are numbered from 1.';
		END IF;
		IF how IS DISTINCT FROM 'release' THEN
			PERFORM idem_sql_check_headers(headers);
		END IF;
	END IF;
	IF how IS DISTINCT FROM 'release' THEN
		limit_bytes := idem_sql_body_limit();
		headers_bytes := coalesce(pg_column_size(headers) - 4, 0);
		IF octet_length(body) > limit_bytes THEN
			PERFORM idem_sql_check_size('response body', octet_length(body), limit_bytes);
		END IF;
		IF coalesce(octet_length(body), 0) + headers_bytes > limit_bytes THEN
			RAISE EXCEPTION 'response of % bytes (body) and % bytes (headers) is larger than idem.max_body_size',
				coalesce(octet_length(body), 0), headers_bytes
				USING ERRCODE = 'program_limit_exceeded',
					  DETAIL = format('idem.max_body_size is %s bytes, and bounds the body and the headers together.', limit_bytes);
		END IF;
	END IF;
END
$$;

/*
 * Finish the key's pending claim (the C edition's protocol_finish): how is
 * complete, fail, fail_retryable or release.  False only for a release of a
 * claim already released.
 */
CREATE FUNCTION idem_sql_finish_as(role oid, how text, tenant text,
								endpoint text, key text, status integer,
								body bytea, attempt integer, headers jsonb,
								plain boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
	function	text := CASE how WHEN 'complete' THEN 'idem_complete()'
							 WHEN 'release' THEN 'idem_release()'
							 ELSE 'idem_fail()' END;
	r			idem_record;
	now			timestamptz;
	why			text;
BEGIN
	/*
	 * a worker called directly: no other how finishes a claim (NULL is
	 * idem_fail's retryable => NULL, which idem_sql_finish_check refuses)
	 */
	IF how NOT IN ('complete', 'fail', 'fail_retryable', 'release') THEN
		RAISE EXCEPTION 'invalid finish of an idem claim: "%"', how
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	/* one simple expression for the names that pass, the checks for the rest */
	IF coalesce(tenant = '' OR octet_length(tenant) > 255 OR
				endpoint = '' OR octet_length(endpoint) > 255 OR
				key = '' OR octet_length(key) > 255, true) THEN
		PERFORM idem_sql_check_name('tenant', tenant);
		PERFORM idem_sql_check_name('endpoint', endpoint);
		PERFORM idem_sql_check_name('key', key);
	END IF;
	/* the binding before the other arguments, as src/api.c checks them */
	IF NOT plain THEN
		PERFORM idem_sql_check_tenant(role, tenant);
	END IF;
	PERFORM idem_sql_finish_check(how, status, body, attempt, headers);
	IF NOT plain THEN
		PERFORM idem_sql_require_primary(function);
	END IF;
	/*
	 * The record is written where it is the live pending claim asked for
	 * (finished when written, after any wait for another writer, as in
	 * src/protocol.c); else it is read locked, to say why not (or to find
	 * it now is: it is then written, under the lock)
	 */
	LOOP
		now := clock_timestamp();
		UPDATE idem_record x
		   SET state = CASE how WHEN 'complete' THEN 'succeeded' ELSE 'failed' END,
			   retryable = how IN ('fail_retryable', 'release'),
			   status = idem_sql_finish_as.status,
			   body = idem_sql_finish_as.body,
			   headers = idem_sql_finish_as.headers,
			   finished_at = clock_timestamp()
		 WHERE x.tenant = idem_sql_finish_as.tenant AND x.endpoint = idem_sql_finish_as.endpoint
		   AND x.key = idem_sql_finish_as.key AND x.state = 'pending'
		   AND NOT idem_sql_expired(x, now)
		   AND (idem_sql_finish_as.attempt IS NULL OR x.attempt = idem_sql_finish_as.attempt);
		IF FOUND THEN
			RETURN true;
		END IF;
		SELECT * INTO r FROM idem_record x
		 WHERE x.tenant = idem_sql_finish_as.tenant AND x.endpoint = idem_sql_finish_as.endpoint
		   AND x.key = idem_sql_finish_as.key
		   FOR UPDATE;
		now := clock_timestamp();
		IF NOT FOUND OR idem_sql_expired(r, now) THEN
			why := 'The key has no live record.';
		ELSIF attempt IS NOT NULL AND attempt <> r.attempt THEN
			why := format('Attempt %s is not the key''s current attempt.', attempt);
		ELSIF r.state <> 'pending' THEN
			IF how = 'release' AND r.state = 'failed' AND r.retryable THEN
				RETURN false;
			END IF;
			why := format('The record of attempt %s has %s.', r.attempt, r.state);
		END IF;
		IF why IS NOT NULL THEN
			RAISE EXCEPTION '%: idem key "%" of endpoint "%" (tenant "%") has no matching pending claim',
				function, key, endpoint, tenant
				USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = why;
		END IF;
	END LOOP;
END
$$;

/*
 * Whether a freeze holds (tenant, endpoint) at now.  The SQL edition keeps
 * no copy of idem_freeze in memory, and reads the table at each claim that
 * would execute.
 */
CREATE FUNCTION idem_sql_frozen(tenant text, endpoint text, now timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	RETURN EXISTS (SELECT FROM idem_freeze f
					WHERE f.tenant = idem_sql_frozen.tenant
					  AND (f.endpoint IS NULL OR f.endpoint = idem_sql_frozen.endpoint)
					  AND (f.until IS NULL OR f.until > now));
END
$$;

/*
 * Under REPEATABLE READ or SERIALIZABLE, idem_sql_frozen reads the
 * transaction's snapshot, which does not hold a freeze committed since,
 * where the C edition's claim reads the latest and answers frozen.  Every
 * freeze updates idem_sql_secret's row, and a claim about to execute under
 * those levels locks it: a row updated since the snapshot cannot be locked,
 * and the claim fails with a serialization failure (40001) instead of
 * executing past the freeze.  (FOR SHARE: a key-share lock would follow
 * the row's update and succeed.  SKIP LOCKED: an uncommitted freeze is not
 * waited for, as under READ COMMITTED; a committed update still fails the
 * lock.)  The row is one for all tenants: a freeze fails once each such
 * claim whose snapshot it postdates, whichever tenant it freezes.
 */
CREATE FUNCTION idem_sql_freeze_seen()
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		PERFORM FROM idem_sql_secret FOR SHARE SKIP LOCKED;
	END IF;
END
$$;

/* The digest the C edition stores for a fingerprint given as bytes, text or jsonb */
CREATE FUNCTION idem_sql_digest(fingerprint bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.sha256(fingerprint) $$;

CREATE FUNCTION idem_sql_digest(fingerprint text)
RETURNS bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.sha256(pg_catalog.convert_to(fingerprint, 'UTF8')) $$;

CREATE FUNCTION idem_sql_digest(fingerprint jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.sha256(pg_catalog.convert_to(fingerprint::text, 'UTF8')) $$;

/*
 * A batch's fingerprints digested, in an array of their shape: NULL for
 * none given, an empty array for an empty one, and for more than one
 * dimension an array of as many, so that the batch's checks of the array
 * (dimensions, length) refuse what the caller gave, as the C edition does
 */
CREATE FUNCTION idem_sql_digests(fingerprints anyarray)
RETURNS bytea[]
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	digests		bytea[];
BEGIN
	IF fingerprints IS NULL THEN
		RETURN NULL;
	END IF;
	IF array_ndims(fingerprints) > 1 THEN
		RETURN array_fill(NULL::bytea,
						  ARRAY(SELECT array_length(fingerprints, d)
								  FROM generate_series(1, array_ndims(fingerprints)) d));
	END IF;
	SELECT coalesce(array_agg(idem_sql_digest(u.f) ORDER BY u.o), '{}')
	  INTO digests
	  FROM unnest(fingerprints) WITH ORDINALITY u(f, o);
	RETURN digests;
END
$$;

/*
 * The bytes the C edition stores for a body or payload given as bytes,
 * text (in the database's encoding) or jsonb (its canonical text)
 */
CREATE FUNCTION idem_sql_bytes(body bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE
AS $$ SELECT body $$;

CREATE FUNCTION idem_sql_bytes(body text)
RETURNS bytea
LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.convert_to(body, pg_catalog.getdatabaseencoding()) $$;

CREATE FUNCTION idem_sql_bytes(body jsonb)
RETURNS bytea
LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.convert_to(body::text, pg_catalog.getdatabaseencoding()) $$;

/* A tenant's records for idem_list, newest first */
CREATE FUNCTION idem_sql_list(ticket bigint, p_tenant text, p_endpoint text,
							  max_rows integer)
RETURNS SETOF idem_record
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
BEGIN
	PERFORM idem_sql_require_execute(role, 'idem_list(text,text,boolean,integer)');
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_tenant(role, p_tenant);
	IF max_rows IS NULL OR max_rows < 1 THEN
		RAISE EXCEPTION 'max_rows must be at least 1' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN QUERY
		SELECT * FROM idem_record r
		 WHERE r.tenant = p_tenant
		   AND (p_endpoint IS NULL OR r.endpoint = p_endpoint)
		 ORDER BY r.endpoint, r.key
		 LIMIT max_rows;
END
$$;

/*
 * The operator tools' workers: PostgreSQL checked EXECUTE on the tool, and
 * each checks the tenant binding, and runs as the role that installed idem.
 */
CREATE FUNCTION idem_sql_forget(ticket bigint, p_tenant text, p_endpoint text,
								p_key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
BEGIN
	PERFORM idem_sql_require_execute(role, 'idem_forget(text,text,text)');
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('endpoint', p_endpoint);
	PERFORM idem_sql_check_name('key', p_key);
	PERFORM idem_sql_check_tenant(role, p_tenant);
	PERFORM idem_sql_require_primary('idem_forget()');
	DELETE FROM idem_record r
	 WHERE r.tenant = p_tenant AND r.endpoint = p_endpoint AND r.key = p_key;
	RETURN FOUND;
END
$$;

CREATE FUNCTION idem_sql_freeze(ticket bigint, p_tenant text, p_endpoint text,
								p_reason text, p_until timestamptz,
								thaw boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
BEGIN
	PERFORM idem_sql_require_execute(role, CASE WHEN thaw THEN 'idem_thaw(text,text)' ELSE 'idem_freeze(text,text,text,timestamptz)' END);
	PERFORM idem_sql_check_name('tenant', p_tenant);
	IF p_endpoint IS NOT NULL THEN
		PERFORM idem_sql_check_name('endpoint', p_endpoint);
	END IF;
	PERFORM idem_sql_check_tenant(role, p_tenant);
	IF thaw THEN
		DELETE FROM idem_freeze f
		 WHERE f.tenant = p_tenant AND f.endpoint IS NOT DISTINCT FROM p_endpoint;
		RETURN FOUND;
	END IF;
	IF p_until <= clock_timestamp() THEN
		/* shown as timestamptz_to_str shows it, whatever DateStyle; undone with the error */
		PERFORM set_config('datestyle', 'ISO', true);
		RAISE EXCEPTION 'until must be in the future'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The until given was %s.', p_until);
	END IF;
	UPDATE idem_sql_secret SET freezes = freezes + 1;
	LOOP
		UPDATE idem_freeze f SET reason = p_reason, until = p_until
		 WHERE f.tenant = p_tenant AND f.endpoint IS NOT DISTINCT FROM p_endpoint;
		IF FOUND THEN
			RETURN false;
		END IF;
		INSERT INTO idem_freeze (tenant, endpoint, reason, until, frozen_at)
		VALUES (p_tenant, p_endpoint, p_reason, p_until, now())
		ON CONFLICT DO NOTHING;
		IF FOUND THEN
			RETURN true;
		END IF;
	END LOOP;
END
$$;

/* The freeze that makes a claim of (tenant, endpoint) answer frozen now */
CREATE FUNCTION idem_sql_frozen_row(ticket bigint, p_tenant text, p_endpoint text)
RETURNS TABLE (reason text, until timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
BEGIN
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('endpoint', p_endpoint);
	PERFORM idem_sql_check_tenant(role, p_tenant);
	RETURN QUERY
		SELECT f.reason, f.until FROM idem_freeze f
		 WHERE f.tenant = p_tenant
		   AND (f.endpoint IS NULL OR f.endpoint = p_endpoint)
		   AND (f.until IS NULL OR f.until > clock_timestamp())
		 ORDER BY f.endpoint NULLS LAST
		 LIMIT 1;
END
$$;

CREATE FUNCTION idem_sql_pause(ticket bigint, p_topic text, p_tenant text,
							   resume boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
BEGIN
	PERFORM idem_sql_require_execute(role, CASE WHEN resume THEN 'idem_resume(text,text)' ELSE 'idem_pause(text,text)' END);
	PERFORM idem_sql_check_name('topic', p_topic);
	IF p_tenant IS NOT NULL THEN
		PERFORM idem_sql_check_name('tenant', p_tenant);
		PERFORM idem_sql_check_tenant(role, p_tenant);
	ELSE
		/* NULL is every tenant, or a bound call's own */
		p_tenant := idem_sql_bound_tenant(role);
	END IF;
	IF resume THEN
		DELETE FROM idem_pause p
		 WHERE p.topic = p_topic AND p.tenant IS NOT DISTINCT FROM p_tenant;
	ELSE
		INSERT INTO idem_pause (topic, tenant, paused_at)
		VALUES (p_topic, p_tenant, now())
		ON CONFLICT DO NOTHING;
	END IF;
	RETURN FOUND;
END
$$;

/*
 * A task's budget (idem_budget) or a spend of it (idem_spend; attempts is
 * then n), as src/budget.c says: the primary key decides between two
 * creations, one UPDATE whose WHERE clause holds the total decides between
 * spends.
 */
CREATE FUNCTION idem_sql_budget(ticket bigint, p_tenant text, p_task text,
								attempts integer, ttl interval, spend boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as(ticket);
	now			timestamptz := clock_timestamp();
	b			record;
	what		text := CASE WHEN spend THEN 'n' ELSE 'attempts' END;
BEGIN
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('task', p_task);
	IF attempts IS NULL THEN
		RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF attempts < 1 THEN
		RAISE EXCEPTION '% must be at least 1', what
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The value given was %s.', attempts);
	END IF;
	PERFORM idem_sql_check_tenant(role, p_tenant);
	PERFORM idem_sql_require_primary(CASE WHEN spend THEN 'idem_spend()' ELSE 'idem_budget()' END);
	IF spend THEN
		UPDATE idem_budget x SET spent = x.spent + attempts
		 WHERE x.tenant = p_tenant AND x.task = p_task AND x.expires_at > now
		   AND x.spent <= x.total - attempts
		RETURNING * INTO b;
		IF FOUND THEN
			RETURN b.total - b.spent;
		END IF;
		SELECT * INTO b FROM idem_budget x
		 WHERE x.tenant = p_tenant AND x.task = p_task AND x.expires_at > now;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'idem budget of task "%" does not exist', p_task
				USING ERRCODE = 'undefined_object',
					  DETAIL = format('It was never created for tenant "%s", or it expired.', p_tenant),
					  HINT = 'Create it with idem_budget().';
		END IF;
		RAISE EXCEPTION 'idem budget of task "%" cannot cover % more attempt%', p_task,
			attempts, CASE WHEN attempts = 1 THEN '' ELSE 's' END
			USING ERRCODE = 'IB001',
				  DETAIL = format('It has spent %s of its %s attempts.', b.spent, b.total),
				  HINT = 'Stop retrying the task, and report it.';
	END IF;
	IF ttl IS NULL THEN
		RAISE EXCEPTION 'ttl must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF now + ttl <= now THEN
		RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO idem_budget AS x (tenant, task, total, spent, created_at, expires_at)
	VALUES (p_tenant, p_task, attempts, 0, now, now + ttl)
	ON CONFLICT (tenant, task) DO UPDATE
		SET total = excluded.total, spent = 0, created_at = excluded.created_at,
			expires_at = excluded.expires_at
		WHERE x.expires_at <= excluded.created_at
	RETURNING * INTO b;
	IF NOT FOUND THEN
		SELECT * INTO b FROM idem_budget x WHERE x.tenant = p_tenant AND x.task = p_task;
	END IF;
	IF b.total <> attempts THEN
		RAISE EXCEPTION 'idem budget of task "%" has % attempts, not %', p_task, b.total, attempts
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A task''s budget is created once; every layer asks for the same total.';
	END IF;
	RETURN b.total - b.spent;
END
$$;

/* One request under several keys (idem_suspects): see src/record.c */
CREATE FUNCTION idem_sql_suspects(ticket bigint, since interval, within interval)
RETURNS TABLE (tenant text, endpoint text, fingerprint bytea, keys text[],
			   first_at timestamptz, last_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
	role			oid := idem_sql_as(ticket);
	bound		text;
BEGIN
	PERFORM idem_sql_require_execute(role, 'idem_suspects(interval,interval)');
	bound := idem_sql_bound_tenant(role);
	IF since IS NULL OR within IS NULL THEN
		RAISE EXCEPTION '% must not be null', CASE WHEN since IS NULL THEN 'since' ELSE 'within' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	RETURN QUERY
	WITH r AS (
		SELECT r.tenant, r.endpoint, r.fingerprint, r.key, r.created_at,
			   r.created_at - lag(r.created_at) OVER w AS gap
		  FROM idem_record r
		 WHERE r.created_at >= clock_timestamp() - since
		   AND r.expires_at > clock_timestamp()
		   AND r.fingerprint IS NOT NULL
		   AND (bound IS NULL OR r.tenant = bound)
		WINDOW w AS (PARTITION BY r.tenant, r.endpoint, r.fingerprint ORDER BY r.created_at, r.key)
	), g AS (
		SELECT r.*, count(*) FILTER (WHERE r.gap IS NULL OR r.gap > within)
					OVER (PARTITION BY r.tenant, r.endpoint, r.fingerprint
						  ORDER BY r.created_at, r.key) AS grp
		  FROM r
	)
	SELECT g.tenant, g.endpoint, g.fingerprint,
		   array_agg(g.key ORDER BY g.created_at, g.key),
		   min(g.created_at), max(g.created_at)
	  FROM g
	 GROUP BY g.tenant, g.endpoint, g.fingerprint, g.grp
	HAVING count(*) > 1
	 ORDER BY min(g.created_at), g.tenant, g.endpoint;
END
$$;

/*
 * The checks of an array argument of a batch (src/args.c's): not NULL
 * (unless optional, when NULL is "none given"), one dimension, no NULL
 * element unless allowed, and as many elements as keys (nkeys NULL: this is
 * keys).  Returns its number of elements.
 */
CREATE FUNCTION idem_sql_check_array(name text, arr anyarray, nkeys integer,
									 optional boolean, null_elements boolean)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	n			integer := coalesce(cardinality(arr), 0);
BEGIN
	IF arr IS NULL THEN
		IF optional THEN
			RETURN NULL;
		END IF;
		RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF array_ndims(arr) > 1 THEN
		RAISE EXCEPTION '% must be a one-dimensional array', name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The array given has %s dimensions.', array_ndims(arr));
	END IF;
	IF NOT null_elements AND array_position(arr, NULL) IS NOT NULL THEN
		RAISE EXCEPTION '% must not contain nulls', name USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF nkeys IS NOT NULL AND n <> nkeys THEN
		RAISE EXCEPTION '% must have as many elements as keys', name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('keys has %s elements, %s has %s.', nkeys, name, n);
	END IF;
	RETURN n;
END
$$;

/*
 * A batch of claims (idem_claim_many): each element what idem_claim would
 * answer, in order, without waiting and without a lock per key
 */
CREATE FUNCTION idem_sql_claim_many(ticket bigint, p_tenant text, p_endpoint text,
									p_keys text[], digests bytea[],
									p_lease interval, p_retention interval)
RETURNS TABLE (key text, outcome text, status integer, body bytea,
			   headers jsonb, attempt integer, created_at timestamptz,
			   expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	n			integer;
	c			record;
BEGIN
	/* digests come from idem_sql_digests, subscripted from 1 */
	IF array_lower(p_keys, 1) <> 1 THEN
		p_keys := idem_sql_rebased(p_keys);
	END IF;
	/* the tenant and the endpoint before the arrays, as src/api.c checks them */
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('endpoint', p_endpoint);
	n := idem_sql_check_array('keys', p_keys, NULL, false, false);
	PERFORM idem_sql_check_array('fingerprints', digests, n, true, true);
	PERFORM idem_sql_check_name('key', k) FROM unnest(p_keys) k;
	/* the binding once for the call, an empty one too (src/api.c) */
	PERFORM idem_sql_check_tenant(role, p_tenant);
	FOR i IN 1 .. n LOOP
		c := idem_sql_claim_as(role, p_tenant, p_endpoint, p_keys[i], digests[i],
							false, p_lease, p_retention, NULL, true);
		key := p_keys[i];
		outcome := c.outcome; status := c.status; body := c.body;
		headers := c.headers; attempt := c.attempt;
		created_at := c.created_at; expires_at := c.expires_at;
		RETURN NEXT;
	END LOOP;
END
$$;

/* A batch of finishes (idem_complete_many, idem_fail_many): how many */
CREATE FUNCTION idem_sql_finish_many(ticket bigint, how text, p_tenant text,
									 p_endpoint text, p_keys text[],
									 statuses integer[], bodies bytea[],
									 attempts integer[], p_headers jsonb[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	n			integer;
BEGIN
	/* a simple expression for arrays that start at 1, a copy for the rest */
	IF array_lower(p_keys, 1) <> 1 OR array_lower(statuses, 1) <> 1 OR
	   array_lower(bodies, 1) <> 1 OR array_lower(attempts, 1) <> 1 OR
	   array_lower(p_headers, 1) <> 1 THEN
		p_keys := idem_sql_rebased(p_keys);
		statuses := idem_sql_rebased(statuses);
		bodies := idem_sql_rebased(bodies);
		attempts := idem_sql_rebased(attempts);
		p_headers := idem_sql_rebased(p_headers);
	END IF;
	/* the tenant and the endpoint before the arrays, as src/api.c checks them */
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('endpoint', p_endpoint);
	n := idem_sql_check_array('keys', p_keys, NULL, false, false);
	PERFORM idem_sql_check_array('statuses', statuses, n, false, false);
	PERFORM idem_sql_check_array('bodies', bodies, n, true, true);
	IF how IS NULL THEN
		RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM idem_sql_check_array('attempts', attempts, n, true, true);
	PERFORM idem_sql_check_array('headers', p_headers, n, true, true);
	/* every element is checked before any is written, as src/api.c does */
	FOR i IN 1 .. n LOOP
		PERFORM idem_sql_check_name('key', p_keys[i]);
		PERFORM idem_sql_finish_check(how, statuses[i], bodies[i], attempts[i],
									  p_headers[i]);
	END LOOP;
	/* the binding once for the call, an empty one too (src/api.c) */
	PERFORM idem_sql_check_tenant(role, p_tenant);
	FOR i IN 1 .. n LOOP
		PERFORM idem_sql_finish_as(role, how, p_tenant, p_endpoint, p_keys[i],
								statuses[i], bodies[i], attempts[i],
								p_headers[i], false);
	END LOOP;
	RETURN n;
END
$$;

/*
 * What only idem's workers call, as the role that installed idem: no
 * other role may.  The workers that idem's API functions call need a
 * ticket of the caller's.
 */
REVOKE ALL ON FUNCTION idem_sql_setting(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_cap(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_body_limit() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_require_binding() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_log_outcomes() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_blocked_by_me(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_decide_claim(oid, text, text, text, bytea, boolean, interval, interval, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_claim_as(oid, text, text, text, bytea, boolean, interval, interval, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_finish_as(oid, text, text, text, text, integer, bytea, integer, jsonb, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_plain_call(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_frozen(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_as(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_as_caller(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_check_tenant(oid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_restriction(oid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_require_execute(oid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_claim_times(timestamptz, interval, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_insert_claim(text, text, text, bytea, timestamptz, timestamptz, timestamptz, boolean, interval, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_claim_lock(text, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_claim_lock_id(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_claim_held(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_wait_writer(text, text, text, xid) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_freeze_seen() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_log(text, text, text, text, text, text, boolean) FROM PUBLIC;
--@ end

--@ before CREATE FUNCTION idem_enqueue\(tenant text, topic text, key text,\s+payload bytea
/* ---- The outbox ---- */

/*
 * The state a reader is shown of a message: a leased message whose lease
 * ran out is what the next take will leave it (src/outbox.c)
 */
CREATE FUNCTION idem_sql_shown_state(m idem_outbox, now timestamptz)
RETURNS text
LANGUAGE sql STABLE
AS $$
	SELECT CASE WHEN m.state = 'leased' AND m.lease_expires_at <= now
				THEN CASE WHEN NOT m.redeliver THEN 'unknown'
						  WHEN m.attempt - m.attempt_base >= m.max_attempts THEN 'dead'
						  ELSE 'queued' END
				ELSE m.state END
$$;

/*
 * The advisory lock of an ordering key (see the head of this file): an
 * enqueue holds it shared until it commits, so that a take, which asks for
 * it exclusively and does not wait, leaves a later message of the ordering
 * key while an earlier one may still be committing.  A transaction takes at
 * most idem_sql_claim_locks() advisory locks of idem's, claims' and these
 * together; past them an enqueue takes none, and a take leases no further
 * message with an ordering key (the next take does).
 */
CREATE FUNCTION idem_sql_order_lock(tenant text, topic text,
									ordering_key text, exclusive boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
	taken		integer := coalesce(nullif(current_setting('idem_sql.claim_locks', true), ''), '0')::integer;
	id			bigint := hashtextextended(tenant || chr(1) || topic || chr(1) || ordering_key,
										   (SELECT s.lock_salt FROM idem_sql_secret s) # 1);
BEGIN
	IF taken >= idem_sql_claim_locks() THEN
		RETURN NOT exclusive;
	END IF;
	IF exclusive THEN
		IF NOT pg_try_advisory_xact_lock(id) THEN
			RETURN false;
		END IF;
	ELSE
		PERFORM pg_advisory_xact_lock_shared(id);
	END IF;
	PERFORM set_config('idem_sql.claim_locks', (taken + 1)::text, true);
	RETURN true;
END
$$;

/* idem.outbox_retention, checked where an enqueue fixes it */
CREATE FUNCTION idem_sql_outbox_retention()
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
	keep		interval := idem_sql_time(idem_sql_guc('idem.outbox_retention', '7d'), 's');
	retry_window interval := idem_sql_time(idem_sql_guc('idem.retry_window', '1h'), 's');
BEGIN
	IF keep <= retry_window THEN
		RAISE EXCEPTION 'idem.outbox_retention (%s) must be longer than idem.retry_window (%s)',
			extract(epoch FROM keep)::bigint, extract(epoch FROM retry_window)::bigint
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A business transaction retried after its message was purged would send it again.';
	END IF;
	PERFORM idem_sql_check_cap('enqueue', 'retention', keep,
							   idem_sql_cap('idem.max_retention', 's'),
							   'idem.max_retention', 's', NULL, 'idem.outbox_retention',
							   keep, 's');
	RETURN keep;
END
$$;

/* The C edition's checks of a message's payload: NULL, larger than the limit */
CREATE FUNCTION idem_sql_check_payload(payload bytea, limit_bytes bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
	IF payload IS NULL THEN
		RAISE EXCEPTION 'payload must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM idem_sql_check_size('payload', octet_length(payload), limit_bytes);
END
$$;

/*
 * What idem_enqueue_many checks once for its batch, before it writes any
 * element, in src/outbox.c's order: the binding and the primary for the
 * role whose ticket this is, then each element's key, payload (its size
 * in bytes, p_sizes) and headers (idem_sql_enqueue checks an element again
 * as it writes it, with the same answers).  The elements' arrays are
 * subscripted from 1 (idem_sql_rebased) and have no NULL key or payload
 * (idem_sql_check_array).
 */
CREATE FUNCTION idem_sql_enqueue_check(ticket bigint, p_tenant text,
									   function text, p_keys text[],
									   p_sizes integer[], p_headers jsonb[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
	limit_bytes	bigint;
BEGIN
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_tenant(idem_sql_as_caller(ticket), p_tenant);
	PERFORM idem_sql_require_primary_of(function, 'idem_outbox');
	IF coalesce(cardinality(p_keys), 0) = 0 THEN
		RETURN;
	END IF;
	/* read at the first payload's check, as src/args.c reads it */
	limit_bytes := idem_sql_body_limit();
	FOR i IN 1 .. cardinality(p_keys) LOOP
		/* simple expressions for what passes, the checks for the rest */
		IF coalesce(p_keys[i] = '' OR octet_length(p_keys[i]) > 255, true) THEN
			PERFORM idem_sql_check_name('key', p_keys[i]);
		END IF;
		IF p_sizes[i] > limit_bytes THEN
			PERFORM idem_sql_check_size('payload', p_sizes[i], limit_bytes);
		END IF;
		IF p_headers[i] IS NOT NULL THEN
			PERFORM idem_sql_check_headers(p_headers[i]);
		END IF;
	END LOOP;
END
$$;

/*
 * Write an outbound message unless its key exists (idem_enqueue): the
 * unique index decides between two enqueues, and the payload between
 * duplicate and mismatch
 */
CREATE FUNCTION idem_sql_enqueue(ticket bigint, p_tenant text, p_topic text,
								 p_key text, p_payload bytea, p_headers jsonb,
								 p_not_before timestamptz,
								 p_ordering_key text, p_max_attempts integer,
								 p_redeliver boolean,
								 OUT outcome text, OUT id bigint,
								 OUT state text, OUT created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	now			timestamptz := clock_timestamp();
	limit_bytes	bigint := idem_sql_body_limit();
	max_attempts integer := coalesce(p_max_attempts,
									 idem_sql_guc('idem.outbox_max_attempts', '10')::integer);
	m			idem_outbox;
BEGIN
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('topic', p_topic);
	PERFORM idem_sql_check_name('key', p_key);
	IF p_payload IS NULL OR octet_length(p_payload) > limit_bytes THEN
		PERFORM idem_sql_check_payload(p_payload, limit_bytes);
	END IF;
	PERFORM idem_sql_check_headers(p_headers);
	IF p_not_before IS NOT NULL AND NOT isfinite(p_not_before) THEN
		RAISE EXCEPTION 'not_before must be a finite time' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF p_ordering_key IS NOT NULL THEN
		PERFORM idem_sql_check_name('ordering_key', p_ordering_key);
	END IF;
	IF max_attempts < 1 THEN
		RAISE EXCEPTION 'max_attempts must be at least 1'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('The max_attempts given was %s.', max_attempts);
	END IF;
	IF p_redeliver IS NULL THEN
		RAISE EXCEPTION 'redeliver must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM idem_sql_check_tenant(role, p_tenant);
	PERFORM idem_sql_require_primary_of('idem_enqueue()', 'idem_outbox');
	IF p_ordering_key IS NOT NULL THEN
		PERFORM idem_sql_order_lock(p_tenant, p_topic, p_ordering_key, false);
	END IF;
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		/*
		 * The snapshot's message answers first: the insert would fail with
		 * a serialization failure on a message changed since (taken, say)
		 */
		SELECT * INTO m FROM idem_outbox o
		 WHERE o.tenant = p_tenant AND o.topic = p_topic AND o.key = p_key;
	END IF;
	IF m.id IS NULL THEN
		INSERT INTO idem_outbox AS o (id, tenant, topic, key, state, payload, headers,
									  ordering_key, redeliver, max_attempts, attempt,
									  attempt_base, not_before, created_at,
									  expires_at, trace)
		VALUES (nextval('idem_outbox_id_seq'), p_tenant, p_topic, p_key, 'queued',
				p_payload, p_headers, p_ordering_key, p_redeliver, max_attempts, 0, 0,
				coalesce(p_not_before, now), now, now + idem_sql_outbox_retention(),
				nullif(current_setting('idem.trace', true), ''))
		ON CONFLICT (tenant, topic, key) DO NOTHING
		RETURNING o.id INTO id;
		IF FOUND THEN
			outcome := 'enqueued';
			state := 'queued';
			created_at := now;
			PERFORM pg_notify('idem_outbox', p_topic);
			PERFORM idem_sql_log('enqueue', p_tenant, 'topic', p_topic, p_key,
								 format('outcome=%s id=%s attempt=0', outcome, id), false);
			RETURN;
		END IF;
		SELECT * INTO m FROM idem_outbox o
		 WHERE o.tenant = p_tenant AND o.topic = p_topic AND o.key = p_key;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'could not serialize access due to concurrent enqueue of idem key "%" of topic "%"',
				p_key, p_topic
				USING ERRCODE = 'serialization_failure', HINT = 'Retry the transaction.';
		END IF;
	END IF;
	outcome := CASE WHEN m.payload = p_payload THEN 'duplicate' ELSE 'mismatch' END;
	id := m.id;
	state := idem_sql_shown_state(m, now);
	created_at := m.created_at;
	PERFORM idem_sql_log('enqueue', p_tenant, 'topic', p_topic, p_key,
						 format('outcome=%s id=%s attempt=%s', outcome, id, m.attempt),
						 outcome = 'mismatch');
END
$$;

/* Lease up to max_messages due messages of a topic (idem_take) */
CREATE FUNCTION idem_sql_take(ticket bigint, p_topic text, max_messages integer,
							  p_lease interval, p_tenant text)
RETURNS TABLE (id bigint, tenant text, topic text, key text, payload bytea,
			   headers jsonb, attempt integer, lease_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	now			timestamptz := clock_timestamp();
	lease_end	timestamptz;
	taken		integer := 0;
	s			text;
	m			idem_outbox;
	c			refcursor;
BEGIN
	PERFORM idem_sql_check_name('topic', p_topic);
	IF max_messages IS NULL THEN
		RAISE EXCEPTION 'max_messages must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF max_messages NOT BETWEEN 1 AND 10000 THEN
		RAISE EXCEPTION 'max_messages % is out of range', max_messages
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'max_messages must be between 1 and 10000.';
	END IF;
	IF p_tenant IS NOT NULL THEN
		PERFORM idem_sql_check_name('tenant', p_tenant);
		PERFORM idem_sql_check_tenant(role, p_tenant);
	ELSE
		p_tenant := idem_sql_bound_tenant(role);
	END IF;
	PERFORM idem_sql_require_primary_of('idem_take()', 'idem_outbox');
	lease_end := idem_sql_lease_end('take', now, p_lease,
								   idem_sql_time(idem_sql_guc('idem.lease', '5min'), 'ms'),
								   idem_sql_cap('idem.max_lease', 'ms'));
	OPEN c FOR
		SELECT o.* FROM idem_outbox o
		 WHERE o.topic = p_topic AND o.state IN ('queued', 'leased')
		   AND o.not_before <= now
		   AND (p_tenant IS NULL OR o.tenant = p_tenant)
		   AND NOT EXISTS (SELECT FROM idem_pause p
							WHERE p.topic = o.topic
							  AND (p.tenant IS NULL OR p.tenant = o.tenant))
		   AND NOT (o.created_at >= now() AND idem_sql_own(o.xmin))
		 ORDER BY o.not_before, o.id
		   FOR UPDATE SKIP LOCKED;
	WHILE taken < max_messages LOOP
		FETCH c INTO m;
		EXIT WHEN NOT FOUND;
		now := clock_timestamp();
		IF m.state NOT IN ('queued', 'leased') OR m.not_before > now THEN
			CONTINUE;
		END IF;
		IF m.state = 'leased' THEN
			s := idem_sql_shown_state(m, now);
			IF s = 'unknown' THEN
				UPDATE idem_outbox o SET state = 'unknown' WHERE o.id = m.id;
				PERFORM idem_sql_log('take', m.tenant, 'topic', m.topic, m.key,
									 format('outcome=unknown id=%s attempt=%s', m.id, m.attempt), true);
				CONTINUE;
			ELSIF s = 'dead' THEN
				UPDATE idem_outbox o
				   SET state = 'dead', last_error = 'the last attempt''s lease ran out',
					   finished_at = now,
					   expires_at = now + coalesce(o.expires_at - o.created_at,
												   idem_sql_outbox_retention())
				 WHERE o.id = m.id;
				PERFORM idem_sql_log('take', m.tenant, 'topic', m.topic, m.key,
									 format('outcome=dead id=%s attempt=%s', m.id, m.attempt), false);
				CONTINUE;
			END IF;
		END IF;
		IF m.ordering_key IS NOT NULL AND
		   (NOT idem_sql_order_lock(m.tenant, m.topic, m.ordering_key, true) OR
			EXISTS (SELECT FROM idem_outbox e
					 WHERE e.tenant = m.tenant AND e.topic = m.topic
					   AND e.ordering_key = m.ordering_key AND e.id < m.id
					   AND e.state IN ('queued', 'leased', 'unknown'))) THEN
			CONTINUE;
		END IF;
		UPDATE idem_outbox o
		   SET state = 'leased', attempt = m.attempt + 1,
			   lease_expires_at = lease_end, not_before = lease_end
		 WHERE o.id = m.id;
		id := m.id; tenant := m.tenant; topic := m.topic; key := m.key;
		payload := m.payload; headers := m.headers; attempt := m.attempt + 1;
		lease_expires_at := lease_end;
		taken := taken + 1;
		PERFORM idem_sql_log('take', m.tenant, 'topic', m.topic, m.key,
							 format('outcome=leased id=%s attempt=%s', m.id, m.attempt + 1), false);
		RETURN NEXT;
	END LOOP;
	CLOSE c;
	/* the dispatcher calls out once the take commits: make that durable */
	IF taken > 0 THEN
		PERFORM set_config('synchronous_commit', 'on', true);
	END IF;
END
$$;

/*
 * Finish a message's lease (idem_delivered, idem_retry, idem_dead) or queue
 * it again (idem_requeue); the state it is left in.  The binding is the
 * caller's, checked before anything else is said of the message.
 */
CREATE FUNCTION idem_sql_finish_message(ticket bigint, how text, p_id bigint,
										p_attempt integer, p_status integer,
										p_body bytea, p_error text,
										p_after interval)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as_caller(ticket);
	function	text := format('idem_%s()', how);
	limit_bytes	bigint := idem_sql_body_limit();
	now			timestamptz;
	m			idem_outbox;
	s			text;
	keep		interval;
BEGIN
	/* a worker called directly: no other how skips the checks below */
	IF how IS NULL OR how NOT IN ('delivered', 'delivered_many', 'retry', 'dead', 'requeue') THEN
		RAISE EXCEPTION 'invalid finish of an idem message: "%"', how
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF how = 'requeue' THEN
		PERFORM idem_sql_require_execute(role, 'idem_requeue(bigint)');
	END IF;
	IF p_id IS NULL THEN
		RAISE EXCEPTION 'id must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF how <> 'requeue' THEN
		IF p_attempt IS NULL THEN
			RAISE EXCEPTION 'attempt must not be null' USING ERRCODE = 'null_value_not_allowed';
		END IF;
		IF p_attempt < 1 THEN
			RAISE EXCEPTION 'attempt % is not a valid attempt number', p_attempt
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Attempts are numbered from 1.';
		END IF;
	END IF;
	IF p_status IS NOT NULL AND p_status NOT BETWEEN 100 AND 599 THEN
		RAISE EXCEPTION 'status % is not an HTTP status code', p_status
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A status must be between 100 and 599.';
	END IF;
	/* a simple expression for the sizes that pass, the checks for the rest */
	IF octet_length(p_body) > limit_bytes OR octet_length(p_error) > limit_bytes THEN
		PERFORM idem_sql_check_size('body', octet_length(p_body), limit_bytes);
		PERFORM idem_sql_check_size('error', octet_length(p_error), limit_bytes);
	END IF;
	IF p_after IS NOT NULL AND (NOT isfinite(p_after) OR p_after < '0') THEN
		RAISE EXCEPTION 'after % is not a delay', p_after
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A retry''s after must be finite and not negative.';
	END IF;
	PERFORM idem_sql_require_primary_of(function, 'idem_outbox');
	SELECT * INTO m FROM idem_outbox o WHERE o.id = p_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION '%: outbox message % does not exist', function, p_id
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	PERFORM idem_sql_check_tenant(role, m.tenant);
	now := clock_timestamp();
	s := idem_sql_shown_state(m, now);
	keep := coalesce(m.expires_at - m.created_at, idem_sql_outbox_retention());
	IF how = 'requeue' THEN
		IF s NOT IN ('dead', 'unknown') THEN
			RAISE EXCEPTION 'idem_requeue(): outbox message % is %', p_id, s
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = 'Only a dead or unknown message can be queued again.';
		END IF;
		UPDATE idem_outbox o
		   SET state = 'queued', attempt_base = m.attempt, not_before = now,
			   finished_at = NULL,
			   expires_at = CASE WHEN m.expires_at IS NULL THEN NULL
								 ELSE m.created_at + (m.expires_at - coalesce(m.finished_at, m.created_at)) END
		 WHERE o.id = p_id;
		PERFORM pg_notify('idem_outbox', m.topic);
		RETURN 'queued';
	END IF;
	IF m.attempt <> p_attempt OR m.attempt = 0 OR
	   NOT (s = 'leased' OR (how LIKE 'delivered%' AND s = 'unknown')) THEN
		RAISE EXCEPTION '%: attempt % of outbox message % is not its live lease',
			function, p_attempt, p_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = CASE WHEN m.state = 'leased' AND s <> 'leased'
								THEN format('The lease of attempt %s ran out; the message is %s.', m.attempt, s)
								ELSE format('The message is %s at attempt %s.', s, m.attempt) END;
	END IF;
	IF how = 'retry' AND m.attempt - m.attempt_base < m.max_attempts THEN
		UPDATE idem_outbox o
		   SET state = 'queued', last_error = p_error,
			   not_before = now + coalesce(p_after, idem_sql_backoff(m.attempt - m.attempt_base))
		 WHERE o.id = p_id;
		PERFORM idem_sql_log(how, m.tenant, 'topic', m.topic, m.key,
							 format('outcome=queued id=%s attempt=%s', m.id, m.attempt), false);
		RETURN 'queued';
	END IF;
	PERFORM idem_sql_log(split_part(how, '_', 1), m.tenant, 'topic', m.topic, m.key,
						 format('outcome=%s id=%s attempt=%s',
								CASE WHEN how LIKE 'delivered%' THEN 'delivered' ELSE 'dead' END,
								m.id, m.attempt), false);
	UPDATE idem_outbox o
	   SET state = CASE WHEN how LIKE 'delivered%' THEN 'delivered' ELSE 'dead' END,
		   last_error = coalesce(p_error, o.last_error),
		   status = coalesce(p_status, o.status),
		   body = coalesce(p_body, o.body),
		   finished_at = now, expires_at = now + keep
	 WHERE o.id = p_id;
	RETURN CASE WHEN how LIKE 'delivered%' THEN 'delivered' ELSE 'dead' END;
END
$$;

/*
 * The backoff after the n-th failed attempt of a run: idem.outbox_backoff
 * doubled for each earlier failure, at most idem.outbox_backoff_max, then
 * between half of that and all of it ("equal jitter")
 */
CREATE FUNCTION idem_sql_backoff(n integer)
RETURNS interval
LANGUAGE sql VOLATILE
AS $$
	SELECT d / 2 + random() * d / 2
	  FROM (SELECT least(idem_sql_time(idem_sql_guc('idem.outbox_backoff', '1s'), 'ms')
						 * power(2, least(greatest(n - 1, 0), 40)),
						 idem_sql_time(idem_sql_guc('idem.outbox_backoff_max', '1h'), 'ms')) AS d) b
$$;

/* A message's state and the receiver's answer (idem_message) */
CREATE FUNCTION idem_sql_message(ticket bigint, p_tenant text, p_topic text,
								 p_key text)
RETURNS TABLE (id bigint, state text, attempt integer,
			   not_before timestamptz, last_error text, status integer,
			   body bytea, created_at timestamptz, finished_at timestamptz,
			   expires_at timestamptz, trace text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, @extschema@, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
	role			oid := idem_sql_as_caller(ticket);
BEGIN
	PERFORM idem_sql_check_name('tenant', p_tenant);
	PERFORM idem_sql_check_name('topic', p_topic);
	PERFORM idem_sql_check_name('key', p_key);
	PERFORM idem_sql_check_tenant(role, p_tenant);
	RETURN QUERY
		SELECT o.id, idem_sql_shown_state(o, clock_timestamp()), o.attempt,
			   o.not_before, o.last_error, o.status, o.body, o.created_at,
			   o.finished_at,
			   /* an unfinished message's expires_at is its retention's anchor */
			   CASE WHEN o.state IN ('delivered', 'dead') THEN o.expires_at END,
			   o.trace
		  FROM idem_outbox o
		 WHERE o.tenant = p_tenant AND o.topic = p_topic AND o.key = p_key;
END
$$;

/*
 * Headers as the contract has them, checked as src/args.c checks them: an
 * object whose keys are RFC 9110 header names and whose values are strings
 * without a line break, or arrays of such strings; the detail names the
 * first header at fault, in jsonb's order of keys.
 */
CREATE FUNCTION idem_sql_check_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
	name		text;
	value		jsonb;
	element		jsonb;
	fault		text;
BEGIN
	IF headers IS NULL THEN
		RETURN;
	END IF;
	IF jsonb_typeof(headers) <> 'object' THEN
		fault := 'The value given is not a JSON object.';
	ELSE
		<<each>>
		FOR name, value IN SELECT h.key, h.value FROM jsonb_each(headers) h LOOP
			IF name !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' THEN
				fault := format('"%s" is not a valid header name.', name);
			ELSIF jsonb_typeof(value) = 'object' THEN
				fault := format('The value of header "%s" is an object.', name);
			ELSIF jsonb_typeof(value) = 'array' THEN
				FOR element IN SELECT e FROM jsonb_array_elements(value) e LOOP
					fault := CASE jsonb_typeof(element)
						WHEN 'object' THEN format('The value of header "%s" is an object.', name)
						WHEN 'array' THEN format('The value of header "%s" has a nested array.', name)
						WHEN 'string' THEN CASE WHEN element #>> '{}' ~ '[\r\n]'
							THEN format('The value of header "%s" has a line break or a NUL.', name) END
						ELSE format('The value of header "%s" is not a string.', name) END;
					EXIT each WHEN fault IS NOT NULL;
				END LOOP;
			ELSIF jsonb_typeof(value) <> 'string' THEN
				fault := format('The value of header "%s" is not a string.', name);
			ELSIF value #>> '{}' ~ '[\r\n]' THEN
				fault := format('The value of header "%s" has a line break or a NUL.', name);
			END IF;
			EXIT WHEN fault IS NOT NULL;
		END LOOP;
	END IF;
	IF fault IS NOT NULL THEN
		RAISE EXCEPTION 'headers must be a JSON object of header names to strings or arrays of strings'
			USING ERRCODE = 'invalid_parameter_value', DETAIL = fault;
	END IF;
END
$$;

REVOKE ALL ON FUNCTION idem_sql_order_lock(text, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_sql_outbox_retention() FROM PUBLIC;
--@ end

--@ body idem_tenant() LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN idem_sql_bound_tenant(to_regrole(quote_ident(current_user))::oid);
END
--@ end

--@ body idem_bind(regrole, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	PERFORM idem_sql_require_binder();
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = role::oid) THEN
		RAISE EXCEPTION 'role with OID % does not exist', role::oid
			USING ERRCODE = 'undefined_object';
	END IF;
	IF tenant IS NULL THEN
		RAISE EXCEPTION 'tenant must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF tenant = '' THEN
		RAISE EXCEPTION 'tenant must not be empty' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF octet_length(tenant) > 255 THEN
		RAISE EXCEPTION 'tenant is too long'
			USING ERRCODE = 'string_data_right_truncation',
				  DETAIL = format('The tenant is %s bytes long; the limit is 255 bytes.',
								  octet_length(tenant));
	END IF;
	INSERT INTO idem_binding AS b (role, tenant) VALUES (role, tenant)
	ON CONFLICT ON CONSTRAINT idem_binding_pkey DO UPDATE SET tenant = excluded.tenant;
END
--@ end

--@ body idem_unbind(regrole) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	PERFORM idem_sql_require_binder();
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	DELETE FROM idem_binding b WHERE b.role = idem_unbind.role;
	RETURN FOUND;
END
--@ end

--@ body idem_claim(text, text, text, bytea, boolean, interval, interval, interval) | idem_claim(text, text, text, text, boolean, interval, interval, interval) | idem_claim(text, text, text, jsonb, boolean, interval, interval, interval) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	c			record;
	digest		bytea := idem_sql_digest(fingerprint);
BEGIN
	/*
	 * An assignment, not a SELECT … FROM, which would build a tuplestore;
	 * with no ticket first, and again with one if a binding may decide
	 * (idem_sql_claim)
	 */
	c := idem_sql_claim(0, tenant, endpoint, key, digest, wait, lease,
						retention, wait_timeout);
	IF c.outcome IS NULL THEN
		c := idem_sql_claim(idem_sql_ticket(), tenant, endpoint, key, digest,
							wait, lease, retention, wait_timeout);
	END IF;
	outcome := c.outcome; status := c.status; body := c.body;
	headers := c.headers; attempt := c.attempt; created_at := c.created_at;
	expires_at := c.expires_at;
END
--@ end



--@ body idem_replay(text, text, text, bytea) | idem_replay(text, text, text, text) | idem_replay(text, text, text, jsonb) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN QUERY
	SELECT * FROM idem_sql_replay(idem_sql_caller(), tenant, endpoint,
								  key, idem_sql_digest(fingerprint));
END
--@ end



--@ body idem_complete(text, text, text, integer, bytea, integer, jsonb) | idem_complete(text, text, text, integer, text, integer, jsonb) | idem_complete(text, text, text, integer, jsonb, integer, jsonb) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	bytes		bytea := idem_sql_bytes(body);
BEGIN
	/* with no ticket first, and again with one if a binding may decide */
	IF idem_sql_finish(0, 'complete', tenant, endpoint, key, status, bytes,
					   attempt, headers) IS NULL THEN
		PERFORM idem_sql_finish(idem_sql_ticket(), 'complete', tenant, endpoint, key,
								status, bytes, attempt, headers);
	END IF;
END
--@ end



--@ body idem_fail(text, text, text, integer, bytea, boolean, integer, jsonb) | idem_fail(text, text, text, integer, text, boolean, integer, jsonb) | idem_fail(text, text, text, integer, jsonb, boolean, integer, jsonb) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	how			text := CASE retryable WHEN true THEN 'fail_retryable' WHEN false THEN 'fail' END;
	bytes		bytea := idem_sql_bytes(body);
BEGIN
	/* as idem_complete */
	IF idem_sql_finish(0, how, tenant, endpoint, key, status, bytes, attempt,
					   headers) IS NULL THEN
		PERFORM idem_sql_finish(idem_sql_ticket(), how, tenant, endpoint, key,
								status, bytes, attempt, headers);
	END IF;
END
--@ end



--@ body idem_release(text, text, text, integer) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	released	boolean;
BEGIN
	/* as idem_complete */
	released := idem_sql_finish(0, 'release', tenant, endpoint, key, NULL, NULL,
								attempt, NULL);
	IF released IS NULL THEN
		released := idem_sql_finish(idem_sql_ticket(), 'release', tenant, endpoint,
									key, NULL, NULL, attempt, NULL);
	END IF;
	RETURN released;
END
--@ end

--@ body idem_purge() LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @extschema@, pg_temp
/*
 * Expired records, then finished outbox messages past their retention and
 * expired budgets (all counted, as src/purge.c counts them), a batch at a
 * time, skipping any that another transaction has locked, and the records
 * of a fencing floor bucket whose row another transaction holds (they will
 * be purged next time): a purge does not wait for another transaction, but
 * for one that is inserting the first floor row of a bucket, which
 * PL/pgSQL cannot see (once per bucket in the table's life).  A pending
 * claim whose lease runs is never purged.
 */
DECLARE
	total		bigint := 0;
	n			bigint;
	now			timestamptz;
	ctids		tid[];
	buckets		integer[];
	locked		integer;
	skip		boolean[] := array_fill(false, ARRAY[4096]);	/* by bucket + 1 */
	skipped		integer;
BEGIN
	PERFORM idem_sql_require_primary('idem_purge()');
	LOOP
		now := clock_timestamp();
		SELECT array_agg(x.ctid), array_agg(DISTINCT hashtext(x.key) & 4095)
		  INTO ctids, buckets
		  FROM (SELECT x.ctid, x.key FROM idem_record x
				 WHERE x.expires_at <= now
				   AND NOT (x.state = 'pending' AND x.lease_expires_at > now)
				   AND NOT skip[(hashtext(x.key) & 4095) + 1]
				 LIMIT 10000) x;
		EXIT WHEN ctids IS NULL;
		/*
		 * The floor rows that the trigger will raise, taken without waiting
		 * (src/record.c, record_hold_floor): the records of a bucket whose
		 * row another transaction holds (an operator's idem_forget left
		 * open) are left for a later purge
		 */
		skipped := 0;
		FOREACH locked IN ARRAY ARRAY(
			SELECT f.bucket FROM idem_attempt_floor f
			 WHERE f.bucket = ANY (buckets)
			EXCEPT ALL
			SELECT h.bucket FROM (SELECT f.bucket FROM idem_attempt_floor f
								   WHERE f.bucket = ANY (buckets)
								   ORDER BY 1
									 FOR NO KEY UPDATE SKIP LOCKED) h)
		LOOP
			skip[locked + 1] := true;
			skipped := skipped + 1;
		END LOOP;
		DELETE FROM idem_record r
		 WHERE r.ctid = ANY (ARRAY(
				SELECT x.ctid FROM idem_record x
				 WHERE x.ctid = ANY (ctids)
				   AND x.expires_at <= now
				   AND NOT (x.state = 'pending' AND x.lease_expires_at > now)
				   AND NOT skip[(hashtext(x.key) & 4095) + 1]
				   FOR UPDATE SKIP LOCKED))
		   AND r.expires_at <= now
		   AND NOT (r.state = 'pending' AND r.lease_expires_at > now);
		GET DIAGNOSTICS n = ROW_COUNT;
		total := total + n;
		/* a batch that deleted nothing and skipped no new bucket: the rest is locked */
		EXIT WHEN cardinality(ctids) < 10000 OR (n = 0 AND skipped = 0);
	END LOOP;
	LOOP
		now := clock_timestamp();
		DELETE FROM idem_outbox o
		 WHERE o.ctid = ANY (ARRAY(
				SELECT x.ctid FROM idem_outbox x
				 WHERE x.state IN ('delivered', 'dead') AND x.expires_at <= now
				 LIMIT 10000
				   FOR UPDATE SKIP LOCKED));
		GET DIAGNOSTICS n = ROW_COUNT;
		total := total + n;
		EXIT WHEN n < 10000;
	END LOOP;
	DELETE FROM idem_sql_ticket t
	 WHERE NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = t.pid);
	DELETE FROM idem_budget b
	 WHERE b.ctid = ANY (ARRAY(
			SELECT x.ctid FROM idem_budget x WHERE x.expires_at <= now
			   FOR UPDATE SKIP LOCKED));
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN total + n;
END
--@ end

--@ body idem_list(text, text, boolean, integer) LANGUAGE sql SET search_path = pg_catalog, @extschema@, pg_temp
	SELECT r.endpoint, r.key, r.state, r.retryable, r.status, r.attempt,
		   r.created_at, r.claimed_at, r.lease_expires_at, r.finished_at,
		   r.expires_at, CASE WHEN with_body THEN r.body END,
		   CASE WHEN with_body THEN r.headers END, r.trace
	  FROM idem_sql_list(idem_sql_ticket(), tenant, endpoint, max_rows) r
--@ end

--@ body idem_forget(text, text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_forget(idem_sql_ticket(), tenant, endpoint, key));
END
--@ end

--@ body idem_freeze(text, text, text, timestamptz) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_freeze(idem_sql_ticket(), tenant, endpoint, reason,
						   until, false));
END
--@ end

--@ body idem_thaw(text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_freeze(idem_sql_ticket(), tenant, endpoint, NULL,
						   NULL, true));
END
--@ end

--@ body idem_frozen(text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN QUERY
	SELECT * FROM idem_sql_frozen_row(idem_sql_ticket(), tenant, endpoint);
END
--@ end

--@ body idem_pause(text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_pause(idem_sql_ticket(), topic, tenant, false));
END
--@ end

--@ body idem_resume(text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_pause(idem_sql_ticket(), topic, tenant, true));
END
--@ end

--@ body idem_budget(text, text, integer, interval) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_budget(idem_sql_ticket(), tenant, task, attempts,
						   ttl, false));
END
--@ end

--@ body idem_spend(text, text, integer) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_budget(idem_sql_ticket(), tenant, task, n, NULL,
						   true));
END
--@ end

--@ body idem_suspects(interval, interval) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN QUERY
	SELECT * FROM idem_sql_suspects(idem_sql_ticket(), since, within);
END
--@ end

--@ body idem_claim_many(text, text, text[], bytea[], interval, interval) | idem_claim_many(text, text, text[], text[], interval, interval) | idem_claim_many(text, text, text[], jsonb[], interval, interval) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN QUERY
	SELECT * FROM idem_sql_claim_many(idem_sql_caller(), tenant, endpoint,
									  keys, idem_sql_digests(fingerprints),
									  lease, retention);
END
--@ end



--@ body idem_complete_many(text, text, text[], integer[], bytea[], integer[], jsonb[]) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_finish_many(idem_sql_caller(), 'complete', tenant,
								endpoint, keys, statuses, bodies, attempts,
								headers));
END
--@ end

--@ body idem_fail_many(text, text, text[], integer[], bytea[], boolean, integer[], jsonb[]) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_finish_many(idem_sql_caller(),
								CASE retryable WHEN true THEN 'fail_retryable' WHEN false THEN 'fail' END,
								tenant, endpoint, keys, statuses, bodies,
								attempts, headers));
END
--@ end

--@ body idem_enqueue(text, text, text, bytea, jsonb, timestamptz, text, integer, boolean) | idem_enqueue(text, text, text, text, jsonb, timestamptz, text, integer, boolean) | idem_enqueue(text, text, text, jsonb, jsonb, timestamptz, text, integer, boolean) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	SELECT * INTO outcome, id, state, created_at
	  FROM idem_sql_enqueue(idem_sql_caller(), tenant, topic, key,
								   idem_sql_bytes(payload), headers, not_before, ordering_key,
								   max_attempts, redeliver);
END
--@ end



--@ body idem_take(text, integer, interval, text) LANGUAGE sql SET search_path = pg_catalog, @extschema@, pg_temp
	SELECT * FROM idem_sql_take(idem_sql_caller(), topic, max_messages, lease, tenant)
--@ end

--@ body idem_delivered(bigint, integer, integer, bytea) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	PERFORM idem_sql_finish_message(idem_sql_caller(), 'delivered',
										id, attempt, status, body, NULL, NULL);
END
--@ end

--@ body idem_retry(bigint, integer, text, interval) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN (SELECT idem_sql_finish_message(idem_sql_caller(), 'retry', id,
								   attempt, NULL, NULL, error, after));
END
--@ end

--@ body idem_dead(bigint, integer, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	PERFORM idem_sql_finish_message(idem_sql_caller(), 'dead', id,
										attempt, NULL, NULL, error, NULL);
END
--@ end

--@ body idem_requeue(bigint) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	PERFORM idem_sql_finish_message(idem_sql_ticket(), 'requeue', id,
										NULL, NULL, NULL, NULL, NULL);
END
--@ end

--@ body idem_message(text, text, text) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
BEGIN
	RETURN QUERY
	SELECT * FROM idem_sql_message(idem_sql_caller(), tenant, topic, key);
END
--@ end

--@ body idem_enqueue_many(text, text, text[], bytea[], jsonb[]) | idem_enqueue_many(text, text, text[], jsonb[], jsonb[]) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	n			integer;
	e			record;
BEGIN
	IF array_lower(keys, 1) <> 1 OR array_lower(payloads, 1) <> 1 OR
	   array_lower(headers, 1) <> 1 THEN
		keys := idem_sql_rebased(keys);
		payloads := idem_sql_rebased(payloads);
		headers := idem_sql_rebased(headers);
	END IF;
	/* the tenant and the topic before the arrays, as src/outbox.c checks them */
	PERFORM idem_sql_check_name('tenant', tenant);
	PERFORM idem_sql_check_name('topic', topic);
	/* the arrays, then their lengths, then the rest, as src/outbox.c */
	n := idem_sql_check_array('keys', keys, NULL, false, false);
	PERFORM idem_sql_check_array('payloads', payloads, NULL, false, false);
	PERFORM idem_sql_check_array('headers', headers, NULL, true, true);
	PERFORM idem_sql_check_array('payloads', payloads, n, false, false);
	PERFORM idem_sql_check_array('headers', headers, n, true, true);
	PERFORM idem_sql_enqueue_check(idem_sql_caller(), tenant,
								   'idem_enqueue_many()', keys,
								   ARRAY(SELECT octet_length(idem_sql_bytes(u.p))
										   FROM unnest(payloads) WITH ORDINALITY u(p, o)
										  ORDER BY u.o),
								   headers);
	FOR i IN 1 .. n LOOP
		e := idem_sql_enqueue(idem_sql_caller(), tenant, topic, keys[i],
							  idem_sql_bytes(payloads[i]), headers[i],
							  NULL, NULL, NULL, true);
		key := keys[i]; outcome := e.outcome; id := e.id; state := e.state;
		created_at := e.created_at;
		RETURN NEXT;
	END LOOP;
END
--@ end


--@ body idem_delivered_many(bigint[], integer[], integer[], bytea[]) LANGUAGE plpgsql SET search_path = pg_catalog, @extschema@, pg_temp
DECLARE
	n			integer := coalesce(idem_sql_check_array('ids', ids, NULL, true, false), 0);
BEGIN
	IF array_lower(ids, 1) <> 1 OR array_lower(attempts, 1) <> 1 OR
	   array_lower(statuses, 1) <> 1 OR array_lower(bodies, 1) <> 1 THEN
		ids := idem_sql_rebased(ids);
		attempts := idem_sql_rebased(attempts);
		statuses := idem_sql_rebased(statuses);
		bodies := idem_sql_rebased(bodies);
	END IF;
	IF n = 0 AND coalesce(cardinality(attempts), 0) = 0 THEN
		RETURN;
	END IF;
	PERFORM idem_sql_check_array('attempts', attempts, NULL, true, false);
	IF attempts IS NULL OR cardinality(attempts) <> n THEN
		RAISE EXCEPTION 'attempts must have as many elements as ids'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('ids has %s elements, attempts has %s.', n,
								  coalesce(cardinality(attempts), 0));
	END IF;
	PERFORM idem_sql_check_array('statuses', statuses, n, true, true);
	PERFORM idem_sql_check_array('bodies', bodies, n, true, true);
	/* the elements' arguments are checked before any is written, as src/outbox.c does */
	FOR i IN 1 .. n LOOP
		IF attempts[i] < 1 THEN
			RAISE EXCEPTION 'attempt % is not a valid attempt number', attempts[i]
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Attempts are numbered from 1.';
		END IF;
		IF statuses[i] NOT BETWEEN 100 AND 599 THEN
			RAISE EXCEPTION 'status % is not an HTTP status code', statuses[i]
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'A status must be between 100 and 599.';
		END IF;
	END LOOP;
	FOR i IN 1 .. n LOOP
		PERFORM idem_sql_finish_message(idem_sql_caller(), 'delivered_many',
										ids[i], attempts[i], statuses[i],
										bodies[i], NULL, NULL);
	END LOOP;
END
--@ end

--@ body idem_stats_read() LANGUAGE plpgsql
BEGIN
	RAISE EXCEPTION 'idem_stats needs the C edition of idem'
		USING ERRCODE = 'feature_not_supported',
			  DETAIL = 'The counters live in shared memory, which only idem''s library can reach.',
			  HINT = 'Count outcomes from the server log with idem.log_outcomes, or read idem_record.';
END
--@ end

--@ body idem_stats_reset() LANGUAGE plpgsql
BEGIN
	RAISE EXCEPTION 'idem_stats needs the C edition of idem'
		USING ERRCODE = 'feature_not_supported',
			  DETAIL = 'The counters live in shared memory, which only idem''s library can reach.';
END
--@ end
