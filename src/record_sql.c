/*-------------------------------------------------------------------------
 *
 * record_sql.c
 *	  idem_record through SQL: the way for a table distributed by Citus,
 *	  and for the purge, the operator listing and idem_forget everywhere.
 *
 * On a Citus coordinator the local idem_record is an empty shell: only SQL
 * reaches the shards.  So this file keeps a statement for every operation
 * of record.h.  Where SQL cannot answer in_progress without waiting for an
 * uncommitted claim (INSERT ... ON CONFLICT waits for it), a writer of a
 * key's record first takes the key's lock (keylock.c) and keeps it to the
 * end of its transaction, as idem 0.1.0 did for every table.
 *
 * The direct way's rules for waits hold here too.  A claim without wait
 * waits for no other transaction: not for one that writes the key, which
 * holds the key's lock (sql_probe asks for it without waiting), and not
 * for one that holds the key's row without that lock (a purge batch
 * deleting an expired record, a DELETE or UPDATE by hand): a re-claim or a
 * finish locks the row it probed with SKIP LOCKED first, and a claim
 * without wait that cannot have it answers in_progress (lock_probed).  A
 * caller that waits, for the key's lock or for the row's, decides again
 * after the wait: the probe comes after the key's lock, and a wait for the
 * row makes the protocol probe again.  So every timestamp written is taken
 * after the last wait, and a record deleted while a caller waited is found
 * absent (a claim inserts a fresh one, fenced above the floor that the
 * deletion raised; a finish reports that the key has no live record), not
 * missed by an UPDATE.  The INSERT of a fresh claim does not wait for the
 * deleter of a record that idem wrote: that record was committed before
 * the probe (its writer held the key's lock until then), and the probe,
 * which reads the newest committed state, found it, or found its deletion
 * committed.  The INSERT waits at the unique index only for a transaction
 * that writes the key without idem's key lock (a call that Citus did not
 * delegate, on another node, or a write by hand), as doc/citus.md says.
 *
 * Every statement is prepared once per backend through SPI and kept
 * (SPI_keepplan), so no call parses anything.  Statements name the table
 * with its schema and compare with OPERATOR(pg_catalog.=), so nothing on a
 * caller's search_path can stand in for them.  The plans are prepared
 * again at the next call after the table's relcache entry is invalidated
 * (DROP EXTENSION, ALTER TABLE, ...) or after any of them was invalidated
 * (DISCARD PLANS or DISCARD ALL, which poolers send between clients,
 * invalidates every cached plan): each is planned with sequential scans
 * off, never by the plan cache on its own.
 *
 * On Citus, once idem_distribute() has distributed idem_record, the table
 * in the extension's schema is a shell that Citus routes each key's
 * statement through to the shard that holds the tenant, so those
 * statements stay as they are.  Only the purge, which spans all tenants,
 * cannot go through the shell: it runs on each node against the shard
 * placements that node holds (sql_purge_targets).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/plancache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "access.h"
#include "extension.h"
#include "keylock.h"
#include "record_way.h"
#include "settings.h"

typedef enum RecordPlan
{
	PLAN_INSERT,
	PLAN_FLOOR,
	PLAN_REFENCE,
	PLAN_FETCH,
	PLAN_LOCK,
	PLAN_LOCK_WAIT,
	PLAN_WRITE,
	PLAN_PURGE_SCAN,
	PLAN_PURGE,
	PLAN_LIST,
	PLAN_FORGET,
	NUM_PLANS
} RecordPlan;

/* The key columns' condition; $1..$3 are tenant, endpoint and key */
#define KEY_MATCH \
	" WHERE tenant OPERATOR(pg_catalog.=) $1" \
	" AND endpoint OPERATOR(pg_catalog.=) $2" \
	" AND key OPERATOR(pg_catalog.=) $3"

/* A key's bucket in idem_attempt_floor, as its trigger computes it */
#define FLOOR_MATCH \
	" WHERE bucket OPERATOR(pg_catalog.=)" \
	" (pg_catalog.hashtext($3) OPERATOR(pg_catalog.&) 4095)"

/* Columns of PLAN_FETCH's result, in order */
enum
{
	COL_STATE = 1,
	COL_RETRYABLE,
	COL_FINGERPRINT,
	COL_STATUS,
	COL_BODY,
	COL_ATTEMPT,
	COL_CREATED_AT,
	COL_LEASE_EXPIRES_AT,
	COL_EXPIRES_AT,
	COL_HEADERS
};

/* Columns of PLAN_LOCK's result, in order: what same_version() compares */
enum
{
	LOCK_STATE = 1,
	LOCK_RETRYABLE,
	LOCK_ATTEMPT,
	LOCK_CREATED_AT,
	LOCK_LEASE_EXPIRES_AT,
	LOCK_EXPIRES_AT,
	LOCK_FINGERPRINT
};

typedef struct PlanSpec
{
	/*
	 * @record@: idem_record, @floor@: idem_attempt_floor; @{...}@: only
	 * where idem_record has the column trace (0.4.0's objects on)
	 */
	const char *sql;
	int			nargs;
	Oid			argtypes[15];
} PlanSpec;

static const PlanSpec plan_specs[NUM_PLANS] = {
	[PLAN_INSERT] = {
		/* the floor is read apart: Citus cannot plan it inside the INSERT */
		"INSERT INTO @record@ (tenant, endpoint, key, state, fingerprint, attempt,"
		" created_at, claimed_at, lease_expires_at, expires_at@{, trace}@)"
		" VALUES ($1, $2, $3, 'pending', $4, $8, $5, $5, $6, $7@{, $9}@)"
		" ON CONFLICT (tenant, endpoint, key) DO NOTHING",
		9, {TEXTOID, TEXTOID, TEXTOID, BYTEAOID,
		TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID}
	},
	[PLAN_FLOOR] = {
		"SELECT attempt FROM @floor@" FLOOR_MATCH,
		3, {TEXTOID, TEXTOID, TEXTOID}
	},
	[PLAN_REFENCE] = {
		"UPDATE @record@ SET attempt = $4" KEY_MATCH,
		4, {TEXTOID, TEXTOID, TEXTOID, INT4OID}
	},
	[PLAN_FETCH] = {
		"SELECT state, retryable, fingerprint, status, body, attempt,"
		" created_at, lease_expires_at, expires_at, headers FROM @record@" KEY_MATCH,
		3, {TEXTOID, TEXTOID, TEXTOID}
	},
	[PLAN_LOCK] = {
		/* a row that another transaction holds, or that is gone: no row */
		"SELECT state, retryable, attempt, created_at, lease_expires_at,"
		" expires_at, fingerprint"
		" FROM @record@" KEY_MATCH " FOR NO KEY UPDATE SKIP LOCKED",
		3, {TEXTOID, TEXTOID, TEXTOID}
	},
	[PLAN_LOCK_WAIT] = {
		"SELECT 1 FROM @record@" KEY_MATCH " FOR NO KEY UPDATE",
		3, {TEXTOID, TEXTOID, TEXTOID}
	},
	[PLAN_WRITE] = {
		/*
		 * $14 is now: a pending claim's claimed_at, or when it finished;
		 * $15 a pending claim's trace (a finish keeps the claim's)
		 */
		"UPDATE @record@ SET state = $4, retryable = $5, fingerprint = $6,"
		" status = $7, body = $8, headers = $9, attempt = $10,"
		" created_at = $11, lease_expires_at = $12, expires_at = $13,"
		" claimed_at = CASE WHEN $4 OPERATOR(pg_catalog.=) 'pending'"
		" THEN $14 ELSE claimed_at END,"
		" finished_at = CASE WHEN $4 OPERATOR(pg_catalog.=) 'pending'"
		" THEN NULL ELSE $14 END"
		"@{, trace = CASE WHEN $4 OPERATOR(pg_catalog.=) 'pending'"
		" THEN $15 ELSE trace END}@" KEY_MATCH,
		15, {TEXTOID, TEXTOID, TEXTOID, TEXTOID, BOOLOID, BYTEAOID, INT4OID,
			BYTEAOID, JSONBOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID}
	},
	[PLAN_PURGE_SCAN] = {
		/* $4[b + 1]: whether the purge leaves bucket b for later */
		"SELECT ctid, pg_catalog.hashtext(key) OPERATOR(pg_catalog.&) 4095,"
		" expires_at FROM @record@ WHERE expires_at OPERATOR(pg_catalog.<=) $1"
		" AND expires_at OPERATOR(pg_catalog.>=) $3"
		" AND (state OPERATOR(pg_catalog.<>) 'pending'"
		" OR lease_expires_at OPERATOR(pg_catalog.<=) $1)"
		" AND NOT $4[(pg_catalog.hashtext(key) OPERATOR(pg_catalog.&) 4095)"
		" OPERATOR(pg_catalog.+) 1]"
		" ORDER BY expires_at LIMIT $2",
		4, {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID, BOOLARRAYOID}
	},
	[PLAN_PURGE] = {
		"WITH deleted AS (DELETE FROM @record@"
		" WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM @record@ WHERE ctid OPERATOR(pg_catalog.=) ANY ($2)"
		" AND expires_at OPERATOR(pg_catalog.<=) $1"
		" AND (state OPERATOR(pg_catalog.<>) 'pending'"
		" OR lease_expires_at OPERATOR(pg_catalog.<=) $1)"
		" FOR UPDATE SKIP LOCKED))"
		" AND expires_at OPERATOR(pg_catalog.<=) $1"
		" AND (state OPERATOR(pg_catalog.<>) 'pending'"
		" OR lease_expires_at OPERATOR(pg_catalog.<=) $1)"
		" RETURNING 1)"
		" SELECT pg_catalog.count(*) FROM deleted",
		2, {TIMESTAMPTZOID, TIDARRAYOID}
	},
	[PLAN_LIST] = {
		"SELECT endpoint, key, state, retryable, status, attempt, created_at,"
		" claimed_at, lease_expires_at, finished_at, expires_at,"
		" CASE WHEN $3 THEN body END, CASE WHEN $3 THEN headers END@{, trace}@"
		" FROM @record@"
		" WHERE tenant OPERATOR(pg_catalog.=) $1"
		" AND ($2 IS NULL OR endpoint OPERATOR(pg_catalog.=) $2)"
		" ORDER BY endpoint, key LIMIT $4",
		4, {TEXTOID, TEXTOID, BOOLOID, INT4OID}
	},
	[PLAN_FORGET] = {
		"DELETE FROM @record@" KEY_MATCH,
		3, {TEXTOID, TEXTOID, TEXTOID}
	},
};

/*
 * Records of one (tenant, endpoint) first claimed since $1, live at $4,
 * with one fingerprint under two or more keys, each within $2 of the one
 * before: a new group starts where the gap is longer.  Of tenant $3 only,
 * if not NULL.  The BRIN index on created_at keeps the scan to $1's
 * window.  An operator's tool, planned at each call rather than kept with
 * the per-key plans: a statement that Citus could not plan must not stop
 * the claims.
 */
static const char suspects_sql[] =
	"SELECT tenant, endpoint, fingerprint,"
	" pg_catalog.array_agg(key ORDER BY created_at, key),"
	" pg_catalog.min(created_at), pg_catalog.max(created_at)"
	" FROM (SELECT *, pg_catalog.sum(gap) OVER (PARTITION BY tenant, endpoint, fingerprint"
	" ORDER BY created_at, key) AS grp"
	" FROM (SELECT tenant, endpoint, key, fingerprint, created_at,"
	" CASE WHEN created_at OPERATOR(pg_catalog.-) pg_catalog.lag(created_at) OVER w"
	" OPERATOR(pg_catalog.<=) $2 THEN 0 ELSE 1 END AS gap"
	" FROM @record@"
	" WHERE created_at OPERATOR(pg_catalog.>=) $1"
	" AND expires_at OPERATOR(pg_catalog.>) $4"
	" AND fingerprint IS NOT NULL"
	" AND ($3 IS NULL OR tenant OPERATOR(pg_catalog.=) $3)"
	" WINDOW w AS (PARTITION BY tenant, endpoint, fingerprint"
	" ORDER BY created_at, key)) g) s"
	" GROUP BY tenant, endpoint, fingerprint, grp"
	" HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>=) 2"
	" ORDER BY 5, 1, 2";

static SPIPlanPtr plans[NUM_PLANS];
static bool record_has_trace = false;	/* idem_record.trace exists */
static bool plans_valid = false;
static bool callback_registered = false;
static Oid	record_relid = InvalidOid;

/* Column c of the first row that the last statement returned */
static Datum
first_row_column(int c, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c,
						 isnull);
}

static void
sql_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == record_relid)
		plans_valid = false;
}

/*
 * The settings every statement of this file is planned and run with: the
 * pinned search_path, and sequential scans off.  The plan cache re-plans a
 * kept statement on its own when the search_path differs from the one it
 * was planned with (the session's temporary schema, created after the
 * plans were, joins the path), and it must then plan with sequential scans
 * off too.  Returns the GUC nest level to end with AtEOXact_GUC().
 */
static int
pin_settings(Oid schema)
{
	int			nestlevel = settings_pin_search_path(schema);

	(void) set_config_option("enable_seqscan", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	return nestlevel;
}

/*
 * A statement's text: the template of plan_specs with the tables' qualified
 * names in place of @record@ and @floor@, and its @{...}@ sections kept
 * only where idem_record has the column trace
 */
static char *
statement_text(const char *template, const char *record, const char *floor)
{
	StringInfoData sql;
	const char *p = template;

	initStringInfo(&sql);
	while (*p != '\0')
	{
		if (strncmp(p, "@record@", 8) == 0)
		{
			appendStringInfoString(&sql, record);
			p += 8;
		}
		else if (strncmp(p, "@floor@", 7) == 0)
		{
			appendStringInfoString(&sql, floor);
			p += 7;
		}
		else if (strncmp(p, "@{", 2) == 0)
		{
			const char *end = strstr(p, "}@");

			Assert(end != NULL);
			if (record_has_trace)
				appendBinaryStringInfo(&sql, p + 2, end - (p + 2));
			p = end + 2;
		}
		else
			appendStringInfoChar(&sql, *p++);
	}
	return sql.data;
}

/*
 * Prepare statement which of plan_specs, against the tables named (a shard
 * placement of idem_record, for the purge), for a generic plan
 */
static SPIPlanPtr
prepare_plan(RecordPlan which, const char *record, const char *floor)
{
	char	   *sql = statement_text(plan_specs[which].sql, record, floor);
	SPIPlanPtr	plan;

	plan = SPI_prepare_cursor(sql, plan_specs[which].nargs,
							  (Oid *) plan_specs[which].argtypes,
							  CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	pfree(sql);
	return plan;
}

/* Prepare every statement against the extension's idem_record. */
static void
prepare_plans(void)
{
	Oid			schema;
	char	   *qualified;
	char	   *qualified_floor;
	int			nestlevel;

	for (int i = 0; i < NUM_PLANS; i++)
	{
		if (plans[i] != NULL)
			SPI_freeplan(plans[i]);
		plans[i] = NULL;
	}

	schema = idem_extension_schema();
	record_relid = access_table("idem_record", schema);
	record_has_trace = access_optional_column(record_relid, "trace", TEXTOID) !=
		InvalidAttrNumber;
	qualified = quote_qualified_identifier(get_namespace_name(schema),
										   "idem_record");
	qualified_floor = quote_qualified_identifier(get_namespace_name(schema),
												 "idem_attempt_floor");

	/*
	 * Every statement finds its rows through an index, however few rows the
	 * table has when it is planned: a plan made while the table is empty
	 * (just created, or truncated by VACUUM after a purge) would otherwise
	 * scan it sequentially, and keep doing so, ever slower, as it fills.  So
	 * each statement gets one generic plan, made now with sequential scans
	 * disabled, and made again only after the table's relcache entry is
	 * invalidated.
	 */
	nestlevel = pin_settings(schema);
	for (int i = 0; i < NUM_PLANS; i++)
	{
		SPIPlanPtr	plan = prepare_plan(i, qualified, qualified_floor);
		CachedPlan *cplan;

		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		cplan = SPI_plan_get_cached_plan(plan);
		ReleaseCachedPlan(cplan, CurrentResourceOwner);
		plans[i] = plan;
	}
	AtEOXact_GUC(true, nestlevel);
	plans_valid = true;
}

/*
 * Whether relid is a table that Citus distributes: then the local table is
 * a shell, and only SQL reaches its rows.  Asked once per relcache
 * invalidation of idem_record (distributing it invalidates it).  Needs a
 * connection to SPI.
 */
bool
sql_distributed(Oid relid)
{
	Oid			argtypes[1] = {REGCLASSOID};
	Datum		values[1] = {ObjectIdGetDatum(relid)};

	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	return access_run_sql("SELECT 1 FROM pg_catalog.pg_dist_partition"
						  " WHERE logicalrelid OPERATOR(pg_catalog.=) $1",
						  1, argtypes, values, true, SPI_OK_SELECT) > 0;
}

/*
 * Connect to SPI for a bracket of calls, make sure every statement has its
 * index plan, and run them with the settings they were planned with
 * (pin_settings).  The direct way opens such a bracket too, inside its
 * own, for what it does through SQL (the purge, the listing, a deletion).
 */
void
sql_open(RecordAccess *ra)
{
	ra->key_locked = false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (!callback_registered)
	{
		idem_on_relcache_change(sql_invalidate, (Datum) 0);
		callback_registered = true;
	}
	for (int i = 0; plans_valid && i < NUM_PLANS; i++)
		if (!SPI_plan_is_valid(plans[i]))
			plans_valid = false;
	if (!plans_valid)
		prepare_plans();
	ra->sql_nestlevel = pin_settings(get_rel_namespace(record_relid));
}

void
sql_close(RecordAccess *ra)
{
	AtEOXact_GUC(true, ra->sql_nestlevel);
	SPI_finish();
}

/*
 * What a direct bracket does through SQL (the purge, the listing, a
 * deletion) runs in a bracket of SQL that the first such call opens, and
 * that closes with the direct one.  Its memory context is SPI's from then
 * on, as an SQL bracket's is throughout; values for the caller go to
 * ra->caller either way.
 */
static void
sql_enter(RecordAccess *ra)
{
	if (ra->methods == &sql_methods || ra->sql_entered)
		return;
	sql_open(ra);
	ra->sql_entered = true;
}

static int
run_plan(RecordPlan which, Datum *values, const char *nulls, long tcount)
{
	int			rc = SPI_execute_plan(plans[which], values, nulls, false, tcount);

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return rc;
}

/* A fingerprint as a statement's argument: NULL when there is none */
static Datum
fingerprint_datum(const IdemFingerprint *fp, char *null)
{
	*null = fp->present ? ' ' : 'n';
	return fp->present ? record_fingerprint_datum(fp) : (Datum) 0;
}

static void
key_datums(const IdemKey *key, Datum *values, char *nulls)
{
	values[0] = PointerGetDatum(key->tenant);
	values[1] = PointerGetDatum(key->endpoint);
	values[2] = PointerGetDatum(key->key);
	nulls[0] = nulls[1] = nulls[2] = ' ';
}

/*
 * Run a read-only look-up of at most one row; false if it found none.
 * Without latest, with the calling statement's snapshot (no new snapshot,
 * no command counter increment); with latest, the newest committed state,
 * even under REPEATABLE READ.
 */
static bool
run_lookup(RecordPlan which, Datum *values, const char *nulls, bool latest)
{
	int			rc;

	if (latest)
		rc = SPI_execute_snapshot(plans[which], values, nulls,
								  GetLatestSnapshot(), InvalidSnapshot,
								  false, false, 1);
	else
		rc = SPI_execute_plan(plans[which], values, nulls, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return SPI_processed > 0;
}

/*
 * The fencing floor of the key's bucket (0 when it has none), as the
 * statement's snapshot shows it, or with latest, as the newest committed
 * state shows it: a purge that committed since this statement began may
 * have raised it.
 */
static int32
read_floor(Datum *values, const char *nulls, bool latest)
{
	bool		isnull;

	if (!run_lookup(PLAN_FLOOR, values, nulls, latest))
		return 0;
	return DatumGetInt32(first_row_column(1, &isnull));
}

/*
 * Insert a fresh pending claim; false if the key already has a record.  The
 * unique index alone decides.  *attempt is the new claim's attempt: one more
 * than the floor of the key's bucket, which the deletion of every earlier
 * record of the key raised.
 *
 * The floor is read twice.  The insert reads it with the calling
 * statement's snapshot, which may predate the deletion of the key's old
 * record (a purge, idem_forget, a DELETE by hand) that the probe saw
 * committed, and so the floor that deletion raised.  So once inserted, the
 * claim reads the newest committed floor and, if it caught up, moves its
 * attempt above it.
 */
static bool
sql_insert_claim(RecordAccess *ra, const IdemKey *key,
				 const IdemFingerprint *fp, TimestampTz now,
				 TimestampTz lease_expires_at, TimestampTz expires_at,
				 const char *trace, int32 *attempt)
{
	Datum		values[9];
	char		nulls[9];
	int32		floor;

	key_datums(key, values, nulls);
	values[3] = fingerprint_datum(fp, &nulls[3]);
	values[4] = TimestampTzGetDatum(now);
	values[5] = TimestampTzGetDatum(lease_expires_at);
	values[6] = TimestampTzGetDatum(expires_at);
	*attempt = read_floor(values, nulls, false) + 1;
	values[7] = Int32GetDatum(*attempt);
	nulls[4] = nulls[5] = nulls[6] = nulls[7] = ' ';
	values[8] = trace != NULL ? CStringGetTextDatum(trace) : (Datum) 0;
	nulls[8] = trace != NULL ? ' ' : 'n';

	run_plan(PLAN_INSERT, values, nulls, 0);
	if (SPI_processed != 1)
		return false;

	floor = read_floor(values, nulls, true);
	if (floor >= *attempt)
	{
		*attempt = floor + 1;
		values[3] = Int32GetDatum(*attempt);
		nulls[3] = ' ';
		run_plan(PLAN_REFENCE, values, nulls, 0);
	}
	return true;
}

/*
 * Read the key's record into rec; false if there is none.  Without latest,
 * the record as the calling statement's snapshot shows it (a read-only
 * look-up: no new snapshot, no command counter increment).  With latest,
 * the newest committed version, even under REPEATABLE READ, so that the
 * caller can compare it with what its transaction snapshot shows.
 */
static bool
fetch(RecordAccess *ra, const IdemKey *key, bool latest, IdemRecord *rec)
{
	Datum		values[3];
	char		nulls[3];
	bool		isnull;
	Datum		d;
	MemoryContext old;

	key_datums(key, values, nulls);
	if (!run_lookup(PLAN_FETCH, values, nulls, latest))
		return false;

	rec->state = record_state_of(TextDatumGetCString(first_row_column(COL_STATE,
																		&isnull)));
	rec->retryable = DatumGetBool(first_row_column(COL_RETRYABLE, &isnull));

	d = first_row_column(COL_FINGERPRINT, &isnull);
	rec->fingerprint.present = false;
	if (!isnull)
		record_read_fingerprint(d, &rec->fingerprint);

	d = first_row_column(COL_STATUS, &isnull);
	rec->has_status = !isnull;
	rec->status = isnull ? 0 : DatumGetInt32(d);

	old = MemoryContextSwitchTo(ra->caller);
	d = first_row_column(COL_BODY, &isnull);
	rec->body = isnull ? NULL : DatumGetByteaPCopy(d);
	d = first_row_column(COL_HEADERS, &isnull);
	rec->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	MemoryContextSwitchTo(old);

	rec->attempt = DatumGetInt32(first_row_column(COL_ATTEMPT, &isnull));
	rec->created_at =
		DatumGetTimestampTz(first_row_column(COL_CREATED_AT, &isnull));
	rec->lease_expires_at =
		DatumGetTimestampTz(first_row_column(COL_LEASE_EXPIRES_AT, &isnull));
	rec->expires_at =
		DatumGetTimestampTz(first_row_column(COL_EXPIRES_AT, &isnull));
	ItemPointerSetInvalid(&rec->tid);
	rec->visible = true;
	return true;
}

/* The record as the calling statement's snapshot shows it */
static bool
sql_fetch(RecordAccess *ra, const IdemKey *key, IdemRecord *rec)
{
	return fetch(ra, key, false, rec);
}

/*
 * Whether two reads of a key's record found the same version: the SQL way
 * recognizes a version by every column that a write carries over from the
 * version it probed (PLAN_LOCK's columns), so that a write never undoes a
 * change made since, by idem or by hand
 */
static bool
same_version(const IdemRecord *a, const IdemRecord *b)
{
	return a->state == b->state && a->retryable == b->retryable &&
		a->attempt == b->attempt && a->created_at == b->created_at &&
		a->lease_expires_at == b->lease_expires_at &&
		a->expires_at == b->expires_at &&
		a->fingerprint.present == b->fingerprint.present &&
		(!a->fingerprint.present ||
		 memcmp(a->fingerprint.digest, b->fingerprint.digest,
				IDEM_FINGERPRINT_LEN) == 0);
}

/*
 * Take the key's lock (waiting for it with wait) and read the newest
 * committed version of its record: idem's writers of a key's record all
 * hold the lock, so what is read stays true until this transaction ends,
 * unless a writer outside that lock (a purge batch, a DELETE or UPDATE by
 * hand) changes it, which lock_probed finds out.  *own tells whether this
 * transaction held the lock before: then the record is its own.
 */
static RecordProbe
sql_probe(RecordAccess *ra, const IdemKey *key, bool wait, RecordIntent intent,
		  IdemRecord *rec, bool *own)
{
	bool		already_held = false;

	if (!ra->key_locked)
	{
		if (!keylock_acquire(key, wait, &already_held))
			return RECORD_BUSY;
		ra->key_locked = true;
		ra->key_held_before = already_held;
	}
	*own = ra->key_held_before;
	if (!fetch(ra, key, true, rec))
		return RECORD_ABSENT;

	/*
	 * Under REPEATABLE READ and SERIALIZABLE: does the transaction's
	 * snapshot show this version?  SQL has no access to the version itself,
	 * so the snapshot's read is compared with it.
	 */
	if (IsolationUsesXactSnapshot())
	{
		IdemRecord	snap;

		rec->visible = fetch(ra, key, false, &snap) && same_version(&snap, rec);
	}
	return RECORD_FOUND;
}

/* Whether another transaction is writing the key's record */
static bool
sql_busy(RecordAccess *ra, const IdemKey *key)
{
	return keylock_held_by_other(key);
}

/* Give back the key's lock taken by sql_probe: nothing was written */
static void
sql_unlock(RecordAccess *ra, const IdemKey *key)
{
	if (ra->key_locked)
		keylock_release(key);
	ra->key_locked = false;
}

/* Whether the row that PLAN_LOCK locked is the version probed */
static bool
locked_is_probed(const IdemRecord *probed)
{
	IdemRecord	locked;
	bool		isnull;
	Datum		d;

	locked.state = record_state_of(TextDatumGetCString(first_row_column(LOCK_STATE,
																		  &isnull)));
	locked.retryable = DatumGetBool(first_row_column(LOCK_RETRYABLE, &isnull));
	locked.attempt = DatumGetInt32(first_row_column(LOCK_ATTEMPT, &isnull));
	locked.created_at =
		DatumGetTimestampTz(first_row_column(LOCK_CREATED_AT, &isnull));
	locked.lease_expires_at =
		DatumGetTimestampTz(first_row_column(LOCK_LEASE_EXPIRES_AT, &isnull));
	locked.expires_at =
		DatumGetTimestampTz(first_row_column(LOCK_EXPIRES_AT, &isnull));
	d = first_row_column(LOCK_FINGERPRINT, &isnull);
	locked.fingerprint.present = false;
	if (!isnull)
		record_read_fingerprint(d, &locked.fingerprint);
	return same_version(&locked, probed);
}

/*
 * Lock the key's record, the version probed, for a re-claim or a
 * finish: RECORD_WRITTEN if this transaction now holds that version, still
 * the newest; RECORD_CHANGED if another version or none is there now (the
 * caller probes again); RECORD_WRITE_BUSY if another transaction holds the
 * row and wait is false.  Only a writer outside the key lock can hold it or
 * have changed it since the probe: a purge batch, a DELETE or an UPDATE by
 * hand.  The UPDATE that follows a lock never waits: the row is this
 * transaction's until it ends.
 *
 * The lock is asked for without waiting first (SKIP LOCKED), as record.c's
 * lock_probed does, so that a claim without wait answers in_progress at
 * once instead of waiting for that writer.  No row comes back both for a
 * row that another transaction holds and for one that is gone: a look at
 * the newest committed state tells them apart (either answer may be stale
 * as soon as it is given, and is then still a correct one: in_progress, or
 * a probe again).  With wait, a row that another transaction holds is
 * waited for (a lock wait: lock_timeout, the deadlock detector and cancel
 * apply), and the answer is then RECORD_CHANGED, whatever that transaction
 * did: what the caller decided, and the timestamps it was about to write,
 * date from before the wait.  Probing again finds no record (the deletion
 * committed), or the row, locked by this transaction, so that the next
 * lock is granted at once.
 */
static RecordWrite
lock_probed(const IdemKey *key, const IdemRecord *probed, bool wait)
{
	Datum		values[3];
	char		nulls[3];

	key_datums(key, values, nulls);
	(void) run_plan(PLAN_LOCK, values, nulls, 1);
	if (SPI_processed == 1)
		return locked_is_probed(probed) ? RECORD_WRITTEN : RECORD_CHANGED;
	if (!wait)
		return run_lookup(PLAN_FETCH, values, nulls, true) ?
			RECORD_WRITE_BUSY : RECORD_CHANGED;
	(void) run_plan(PLAN_LOCK_WAIT, values, nulls, 1);
	return RECORD_CHANGED;
}

/*
 * record_write: after a lock that had to wait (lock_probed), the caller
 * probes again, and finds out whether the record is still there.  A finish
 * changes no indexed column, so it is a HOT update when the page has room.
 */
static RecordWrite
sql_write(RecordAccess *ra, const IdemKey *key, const IdemRecord *probed,
		  const IdemRecord *next, TimestampTz now, bool wait)
{
	RecordWrite result;
	Datum		values[15];
	char		nulls[15];

	result = lock_probed(key, probed, wait);
	if (result != RECORD_WRITTEN)
		return result;

	key_datums(key, values, nulls);
	memset(&nulls[3], ' ', 11);
	values[3] = CStringGetTextDatum(record_state_names[next->state]);
	values[4] = BoolGetDatum(next->retryable);
	values[5] = fingerprint_datum(&next->fingerprint, &nulls[5]);
	values[6] = Int32GetDatum(next->status);
	nulls[6] = next->has_status ? ' ' : 'n';
	values[7] = PointerGetDatum(next->body);
	nulls[7] = next->body != NULL ? ' ' : 'n';
	values[8] = PointerGetDatum(next->headers);
	nulls[8] = next->headers != NULL ? ' ' : 'n';
	values[9] = Int32GetDatum(next->attempt);
	values[10] = TimestampTzGetDatum(next->created_at);
	values[11] = TimestampTzGetDatum(next->lease_expires_at);
	values[12] = TimestampTzGetDatum(next->expires_at);
	values[13] = TimestampTzGetDatum(now);
	values[14] = next->state == IDEM_PENDING && next->trace != NULL ?
		CStringGetTextDatum(next->trace) : (Datum) 0;
	nulls[14] = values[14] != (Datum) 0 ? ' ' : 'n';

	run_plan(PLAN_WRITE, values, nulls, 0);
	if (SPI_processed != 1)
		elog(ERROR, "idem_record lost a locked record");
	return RECORD_WRITTEN;
}

/*
 * Run read-only plan with values and nulls, and return its rows as tuples
 * of desc in the caller's memory.  The operator tools are STABLE: their
 * statements run under the caller's snapshot, as PL/pgSQL runs the
 * statements of a function that is not VOLATILE.
 */
static List *
rows_of(RecordAccess *ra, SPIPlanPtr plan, Datum *values, char *nulls,
		TupleDesc desc)
{
	List	   *rows = NIL;
	int			rc;

	rc = SPI_execute_plan(plan, values, nulls, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (desc->natts != SPI_tuptable->tupdesc->natts)
		elog(ERROR, "incorrect number of output arguments");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		int			ncols = SPI_tuptable->tupdesc->natts;
		Datum	   *cols = palloc(ncols * sizeof(Datum));
		bool	   *isnull = palloc(ncols * sizeof(bool));
		MemoryContext old;

		heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
						  cols, isnull);
		old = MemoryContextSwitchTo(ra->caller);
		rows = lappend(rows, heap_form_tuple(desc, cols, isnull));
		MemoryContextSwitchTo(old);
	}
	return rows;
}

/*
 * Up to max_rows records of a tenant (of one endpoint, if not NULL), bodies
 * only if asked, as tuples of desc, the operator listing's row type.
 */
List *
sql_list(RecordAccess *ra, text *tenant, text *endpoint, bool with_body,
		 int32 max_rows, TupleDesc desc)
{
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	sql_enter(ra);
	values[0] = PointerGetDatum(tenant);
	values[1] = PointerGetDatum(endpoint);
	nulls[1] = endpoint != NULL ? ' ' : 'n';
	values[2] = BoolGetDatum(with_body);
	values[3] = Int32GetDatum(max_rows);
	return rows_of(ra, plans[PLAN_LIST], values, nulls, desc);
}

/*
 * The suspects (idem_suspects): groups of records of one tenant (every
 * tenant if tenant is NULL) and endpoint that share a fingerprint under two
 * or more keys, first claimed since from, each within within of another,
 * live at now; as tuples of desc
 */
List *
sql_suspects(RecordAccess *ra, TimestampTz from, Interval *within,
			 text *tenant, TimestampTz now, TupleDesc desc)
{
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	Oid			argtypes[4] = {TIMESTAMPTZOID, INTERVALOID, TEXTOID,
	TIMESTAMPTZOID};
	Oid			schema;
	char	   *sql;
	SPIPlanPtr	plan;
	int			nestlevel;
	List	   *rows;

	sql_enter(ra);
	schema = idem_extension_schema();
	sql = statement_text(suspects_sql,
						 quote_qualified_identifier(get_namespace_name(schema),
													"idem_record"),
						 NULL);
	/* planned, and run, as the kept statements are: sequential scans off */
	nestlevel = pin_settings(schema);
	plan = SPI_prepare(sql, 4, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	values[0] = TimestampTzGetDatum(from);
	values[1] = PointerGetDatum(within);
	values[2] = PointerGetDatum(tenant);
	nulls[2] = tenant != NULL ? ' ' : 'n';
	values[3] = TimestampTzGetDatum(now);
	rows = rows_of(ra, plan, values, nulls, desc);
	AtEOXact_GUC(true, nestlevel);
	return rows;
}

/* Delete the key's record, whatever its state; false if it had none */
bool
sql_delete(RecordAccess *ra, const IdemKey *key)
{
	Datum		values[3];
	char		nulls[3];

	sql_enter(ra);
	key_datums(key, values, nulls);
	run_plan(PLAN_FORGET, values, nulls, 0);
	return SPI_processed == 1;
}

/* record_forget: with the key's lock, so after any writer of the key */
static bool
sql_forget(RecordAccess *ra, const IdemKey *key)
{
	IdemRecord	rec;
	bool		own;

	(void) sql_probe(ra, key, true, RECORD_FOR_FORGET, &rec, &own);
	return sql_delete(ra, key);
}

/* The SQL way has nothing to set up for writing: its statements lock */
static void
sql_prepare_write(RecordAccess *ra)
{
}

/*
 * The relations the purge on this node goes through, as a list of OIDs in
 * the caller's memory context: idem_record itself, or, when Citus has
 * distributed it (*distributed), the shard placements that this node holds
 * (none on a coordinator without shards).  A statement on the distributed
 * table would have to span every shard at once, which Citus cannot plan for
 * a batch delete; each node deleting from its own placements needs no
 * coordination and follows the shards wherever the rebalancer moves them.
 */
List *
sql_purge_targets(RecordAccess *ra, bool *distributed)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(record_relid)};
	List	   *targets = NIL;
	MemoryContext old;

	sql_enter(ra);
	*distributed = sql_distributed(record_relid);
	if (!*distributed)
	{
		old = MemoryContextSwitchTo(ra->caller);
		targets = list_make1_oid(record_relid);
		MemoryContextSwitchTo(old);
		return targets;
	}

	(void) access_run_sql("SELECT r FROM (SELECT pg_catalog.to_regclass("
						  "pg_catalog.shard_name(s.logicalrelid, s.shardid))"
						  " AS r FROM pg_catalog.pg_dist_shard s"
						  " JOIN pg_catalog.pg_dist_placement p"
						  " ON p.shardid OPERATOR(pg_catalog.=) s.shardid"
						  " WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1"
						  " AND p.groupid OPERATOR(pg_catalog.=) (SELECT groupid"
						  " FROM pg_catalog.pg_dist_local_group)) placements"
						  " WHERE r IS NOT NULL ORDER BY r",
						  1, argtypes, values, true, SPI_OK_SELECT);
	old = MemoryContextSwitchTo(ra->caller);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		shard = SPI_getbinval(SPI_tuptable->vals[i],
										  SPI_tuptable->tupdesc, 1, &isnull);

		targets = lappend_oid(targets, DatumGetObjectId(shard));
	}
	MemoryContextSwitchTo(old);
	return targets;
}

/*
 * Run one of the purge's statements (PLAN_PURGE_SCAN or PLAN_PURGE) against
 * target: the local idem_record through its kept plan, or a shard
 * placement of the distributed one.  A placement's statement is prepared at
 * each call: placements come and go as shards move, and a purge runs a few
 * statements a minute.  Citus refuses changes to a shard from outside its
 * own executor unless citus.enable_manual_changes_to_shards is on; it is,
 * for this statement only.  Like the kept plans, the plan finds its rows
 * through an index (or by their ctids).
 */
static void
run_purge_plan(RecordPlan which, Oid target, Datum *values, const char *nulls)
{
	SPIPlanPtr	plan;
	int			nestlevel;
	int			rc;
	char	   *schema;

	if (target == record_relid)
	{
		run_plan(which, values, nulls, 0);
		return;
	}

	schema = get_namespace_name(get_rel_namespace(target));
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("citus.enable_manual_changes_to_shards", "on",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	plan = prepare_plan(which,
						quote_qualified_identifier(schema, get_rel_name(target)),
						"");
	rc = SPI_execute_plan(plan, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	AtEOXact_GUC(true, nestlevel);
	SPI_freeplan(plan);
}

/*
 * Delete up to batch records of target (one of sql_purge_targets()) that
 * expired by now, without ever waiting for another transaction, and commit
 * nothing: the caller's transaction holds what the batch did.
 *
 * A batch first reads, without locking anything, up to batch expired
 * records in expiry order from scan->from on, leaving out the buckets of
 * the fencing floor in scan->skip; then takes the floor rows of their
 * buckets without waiting (record_hold_floor); and only then deletes those
 * of its records whose bucket it holds.  So the AFTER DELETE trigger that
 * raises the floor finds every row it updates already held, and the batch
 * never waits with deletions made: a transaction that holds a bucket (an
 * operator's idem_forget left open) makes the purge leave that bucket's
 * records, which go into scan->skip for the rest of this purge, and the
 * next purge tries them again.  The deletion locks its rows with SKIP
 * LOCKED: a purge never waits for a claim, and a pending claim whose lease
 * runs is kept, whatever its expiry says.  The rows are named by ctid: the
 * caller's snapshot is still active, so no version that the read saw can
 * be pruned and its slot reused before the deletion; a version that
 * another transaction updated since is no longer visible, or is locked,
 * and is left.
 *
 * scan->from moves to the last expiry read: without it, every batch would
 * walk again over the index entries of the rows that the batches before
 * it deleted, which stay until VACUUM.  *more tells whether another batch
 * may find more: this one read a full batch, and deleted something, left
 * out a bucket more, or moved scan->from on (otherwise the next batch
 * would read the same records again).  A shard placement that has gone
 * since the targets were listed (moved away and dropped) has nothing left
 * to purge.
 */
uint64
sql_purge_batch(RecordAccess *ra, Oid target, TimestampTz now, int batch,
				IdemPurgeScan *scan, bool *more)
{
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	Datum	   *skip;
	bool		wanted[IDEM_FLOOR_BUCKETS] = {false};
	int32	   *buckets;
	bool	   *held;
	int			nbuckets = 0;
	int			newly_skipped = 0;
	ItemPointerData *tids;
	int32	   *row_buckets;
	Datum	   *delete_tids;
	int			ndelete = 0;
	uint64		nrows;
	TimestampTz from = scan->from;
	bool		isnull;
	uint64		deleted = 0;

	sql_enter(ra);
	*more = false;
	if (target != record_relid)
	{
		/* lock, then look: the placement cannot go while we purge it */
		LockRelationOid(target, RowExclusiveLock);
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(target)))
		{
			UnlockRelationOid(target, RowExclusiveLock);
			return 0;
		}
	}

	/* the next records to delete, and their buckets */
	skip = palloc(IDEM_FLOOR_BUCKETS * sizeof(Datum));
	for (int b = 0; b < IDEM_FLOOR_BUCKETS; b++)
		skip[b] = BoolGetDatum(scan->skip[b]);
	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch);
	values[2] = TimestampTzGetDatum(scan->from);
	values[3] = PointerGetDatum(construct_array(skip, IDEM_FLOOR_BUCKETS,
												BOOLOID, 1, true,
												TYPALIGN_CHAR));
	run_purge_plan(PLAN_PURGE_SCAN, target, values, nulls);
	nrows = SPI_processed;
	if (nrows == 0)
		return 0;
	tids = palloc(nrows * sizeof(ItemPointerData));
	row_buckets = palloc(nrows * sizeof(int32));
	for (uint64 i = 0; i < nrows; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		tids[i] = *(ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 1,
																  &isnull));
		row_buckets[i] = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
		if (row_buckets[i] < 0 || row_buckets[i] >= IDEM_FLOOR_BUCKETS)
			elog(ERROR, "idem purge read bucket %d", row_buckets[i]);
		wanted[row_buckets[i]] = true;
		if (i == nrows - 1)
			scan->from = DatumGetTimestampTz(SPI_getbinval(row, desc, 3,
														   &isnull));
	}

	/* their buckets of the floor, in bucket order, as the trigger goes */
	buckets = palloc(IDEM_FLOOR_BUCKETS * sizeof(int32));
	for (int b = 0; b < IDEM_FLOOR_BUCKETS; b++)
		if (wanted[b])
			buckets[nbuckets++] = b;
	held = palloc(nbuckets * sizeof(bool));
	record_hold_floor(buckets, nbuckets, held);
	for (int i = 0; i < nbuckets; i++)
	{
		wanted[buckets[i]] = held[i];
		if (!held[i])
		{
			scan->skip[buckets[i]] = true;
			newly_skipped++;
		}
	}

	/* delete the records of the buckets held */
	delete_tids = palloc(nrows * sizeof(Datum));
	for (uint64 i = 0; i < nrows; i++)
		if (wanted[row_buckets[i]])
			delete_tids[ndelete++] = PointerGetDatum(&tids[i]);
	if (ndelete > 0)
	{
		values[1] = PointerGetDatum(construct_array(delete_tids, ndelete,
													TIDOID,
													sizeof(ItemPointerData),
													false, TYPALIGN_SHORT));
		run_purge_plan(PLAN_PURGE, target, values, nulls);
		deleted = (uint64) DatumGetInt64(first_row_column(1, &isnull));
	}

	*more = nrows == (uint64) batch &&
		(deleted > 0 || newly_skipped > 0 || scan->from > from);
	return deleted;
}

const RecordMethods sql_methods = RECORD_METHODS(sql);
