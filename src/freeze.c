/*-------------------------------------------------------------------------
 *
 * freeze.c
 *	  Freezing an entry point (0.4.0): the engineer on call stops every new
 *	  execution of one tenant's endpoint (or of all its endpoints) at once,
 *	  while retries of what was already done go on being replayed.
 *
 * A freeze is a row of idem_freeze (tenant, endpoint; endpoint NULL for
 * every endpoint of the tenant), with a reason and an optional end
 * (until), after which it no longer holds, by itself.  A claim that would
 * execute (protocol.c) asks freeze_holds() first and answers "frozen"
 * instead, writing nothing; what it would replay or report is not
 * affected.
 *
 * The claim path must not pay a look-up in the table: each backend keeps
 * the table's rows in memory and reads them again after a relcache
 * invalidation of the table.  The table's statement trigger
 * idem_freeze_changed sends that invalidation for every INSERT, UPDATE,
 * DELETE and TRUNCATE, committed with the change, and every backend
 * processes it before its next transaction or lock: a freeze holds for
 * every claim that starts after the freeze committed.  The rows are read
 * with the latest snapshot, not the caller's (a REPEATABLE READ snapshot
 * taken before the freeze would keep it out of the copy until the next
 * change); an invalidation that arrives while they are read makes this
 * copy serve the current call only.  A database whose SQL objects are
 * older than 0.4.0's has no table and nothing frozen; there the table is
 * looked for at every claim, so that ALTER EXTENSION idem UPDATE brings
 * freezes in at once.
 *
 * idem_freeze and idem_thaw write the table through SQL as its owner,
 * after checking the tenant binding as the caller: a bound role granted
 * them freezes and thaws its own tenant's endpoints only.  idem_frozen
 * answers from the same copy, for the tenant the caller may see.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "access.h"
#include "args.h"
#include "extension.h"
#include "freeze.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_freeze);
PG_FUNCTION_INFO_V1(idem_thaw);
PG_FUNCTION_INFO_V1(idem_frozen);
PG_FUNCTION_INFO_V1(idem_freeze_changed);

/* One row of idem_freeze */
typedef struct Freeze
{
	text	   *tenant;
	text	   *endpoint;		/* NULL: every endpoint of the tenant */
	text	   *reason;			/* may be NULL */
	TimestampTz until;			/* DT_NOEND: until thawed */
} Freeze;

static MemoryContext freeze_context = NULL;
static List *freezes = NIL;		/* of Freeze, in freeze_context */
static bool freezes_valid = false;
static Oid	freeze_relid = InvalidOid;

static void
freeze_relcache_changed(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == freeze_relid)
		freezes_valid = false;
}

static bool
text_equal(const text *a, const text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* The table of freezes in this database, or InvalidOid for older objects */
static Oid
freeze_table(void)
{
	Oid			schema = idem_extension_schema();

	return OidIsValid(schema) ? get_relname_relid("idem_freeze", schema) :
		InvalidOid;
}

/*
 * Read idem_freeze into freeze_context, with the latest snapshot.  The
 * rows are read directly, so no privilege or policy of the caller plays a
 * part.
 */
static void
freezes_read(Oid relid)
{
	Relation	rel;
	Snapshot	snapshot;
	SysScanDesc scan;
	HeapTuple	tuple;
	MemoryContext old;
	AttrNumber	attnum[4];
	static const char *const columns[] = {"tenant", "endpoint", "reason",
	"until"};

	rel = table_open(relid, AccessShareLock);
	access_columns(rel, columns, lengthof(columns), attnum);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	old = MemoryContextSwitchTo(freeze_context);
	while ((tuple = systable_getnext(scan)) != NULL)
	{
		Freeze	   *f = palloc(sizeof(Freeze));
		bool		isnull;
		Datum		d;

		d = heap_getattr(tuple, attnum[0], RelationGetDescr(rel), &isnull);
		if (isnull)
			continue;
		f->tenant = DatumGetTextPCopy(d);
		d = heap_getattr(tuple, attnum[1], RelationGetDescr(rel), &isnull);
		f->endpoint = isnull ? NULL : DatumGetTextPCopy(d);
		d = heap_getattr(tuple, attnum[2], RelationGetDescr(rel), &isnull);
		f->reason = isnull ? NULL : DatumGetTextPCopy(d);
		d = heap_getattr(tuple, attnum[3], RelationGetDescr(rel), &isnull);
		f->until = isnull ? DT_NOEND : DatumGetTimestampTz(d);
		freezes = lappend(freezes, f);
	}
	MemoryContextSwitchTo(old);
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/* The freezes of this database, read again when the table changed */
static List *
freezes_current(void)
{
	Oid			relid;

	if (freezes_valid)
		return freezes;
	if (freeze_context == NULL)
	{
		freeze_context = AllocSetContextCreate(CacheMemoryContext,
											   "idem freezes",
											   ALLOCSET_SMALL_SIZES);
		idem_on_relcache_change(freeze_relcache_changed, (Datum) 0);
	}
	MemoryContextReset(freeze_context);
	freezes = NIL;
	relid = freeze_table();
	freeze_relid = relid;
	if (!OidIsValid(relid))
		return NIL;
	freezes_valid = true;
	freezes_read(relid);
	return freezes;
}

/* The freeze that holds tenant's endpoint at now, or NULL */
static Freeze *
freeze_of(text *tenant, text *endpoint, TimestampTz now)
{
	List	   *all = freezes_current();
	ListCell   *lc;
	Freeze	   *found = NULL;

	foreach(lc, all)
	{
		Freeze	   *f = (Freeze *) lfirst(lc);

		if (f->until <= now || !text_equal(f->tenant, tenant))
			continue;
		if (f->endpoint != NULL && !text_equal(f->endpoint, endpoint))
			continue;
		/* the endpoint's own freeze says more than the tenant's */
		if (found == NULL || f->endpoint != NULL)
			found = f;
	}
	return found;
}

/*
 * Whether a claim of key at now must not execute.  Costs a comparison per
 * freeze in the database, none when nothing is frozen.
 */
bool
freeze_holds(const IdemKey *key, TimestampTz now)
{
	return freeze_of(key->tenant, key->endpoint, now) != NULL;
}

/* The tenant argument of idem_freeze and idem_thaw, checked as the caller */
static text *
tenant_from_args(FunctionCallInfo fcinfo)
{
	text	   *tenant = key_part_from_arg(fcinfo, 0, "tenant");

	tenant_check(tenant);
	return tenant;
}

/* Run a statement on idem_freeze as its owner; how many rows it changed */
static uint64
freeze_write(const char *sql, int nargs, Oid *argtypes, Datum *values,
			 char *nulls)
{
	AccessAsOwner a;
	SPIPlanPtr	plan;
	uint64		changed;

	if (!OidIsValid(access_sql_enter_table(&a, "idem_freeze")))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"idem_freeze\" of extension \"idem\" does not exist in this database"),
				 errhint("Run ALTER EXTENSION idem UPDATE in this database.")));
	plan = SPI_prepare(sql, nargs, argtypes);
	if (plan == NULL ||
		SPI_execute_plan(plan, values, nulls, false, 0) < 0)
		elog(ERROR, "SPI_execute_plan failed: %s",
			 SPI_result_code_string(SPI_result));
	changed = SPI_processed;
	access_sql_leave(&a);
	return changed;
}

/*
 * idem_freeze(tenant, endpoint, reason, until): no claim of the tenant's
 * endpoint (of every endpoint for NULL) executes until idem_thaw or until;
 * true if this call froze it, false if it was frozen already (its reason
 * and end are then replaced).  Under READ COMMITTED a concurrent freeze of
 * the same endpoint is waited for and then updated; under REPEATABLE READ
 * it is a serialization failure, as for any UPDATE.
 */
Datum
idem_freeze(PG_FUNCTION_ARGS)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	values[0] = PointerGetDatum(tenant_from_args(fcinfo));
	if (PG_ARGISNULL(1))
		nulls[1] = 'n';
	else
		values[1] = PointerGetDatum(check_key_part(PG_GETARG_TEXT_PP(1),
												   "endpoint"));
	if (PG_ARGISNULL(2))
		nulls[2] = 'n';
	else
		values[2] = PG_GETARG_DATUM(2);
	if (PG_ARGISNULL(3))
		nulls[3] = 'n';
	else
	{
		TimestampTz until = PG_GETARG_TIMESTAMPTZ(3);

		if (until <= GetCurrentTimestamp())
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("until must be in the future"),
					 errdetail("The until given was %s.",
							   timestamptz_to_str(until))));
		values[3] = TimestampTzGetDatum(until);
	}

	for (;;)
	{
		if (freeze_write("UPDATE idem_freeze f SET reason = $3, until = $4"
						 " WHERE f.tenant OPERATOR(pg_catalog.=) $1"
						 " AND f.endpoint IS NOT DISTINCT FROM $2",
						 4, argtypes, values, nulls) == 1)
			PG_RETURN_BOOL(false);
		if (freeze_write("INSERT INTO idem_freeze"
						 " (tenant, endpoint, reason, until, frozen_at)"
						 " VALUES ($1, $2, $3, $4, pg_catalog.now())"
						 " ON CONFLICT DO NOTHING",
						 4, argtypes, values, nulls) == 1)
			PG_RETURN_BOOL(true);
		/* a concurrent freeze inserted it first: update that one */
		CHECK_FOR_INTERRUPTS();
	}
}

/* idem_thaw(tenant, endpoint): lift that freeze; true if there was one */
Datum
idem_thaw(PG_FUNCTION_ARGS)
{
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	char		nulls[2] = {' ', ' '};

	values[0] = PointerGetDatum(tenant_from_args(fcinfo));
	if (PG_ARGISNULL(1))
		nulls[1] = 'n';
	else
		values[1] = PointerGetDatum(check_key_part(PG_GETARG_TEXT_PP(1),
												   "endpoint"));
	PG_RETURN_BOOL(freeze_write("DELETE FROM idem_freeze f"
								" WHERE f.tenant OPERATOR(pg_catalog.=) $1"
								" AND f.endpoint IS NOT DISTINCT FROM $2",
								2, argtypes, values, nulls) == 1);
}

/*
 * idem_frozen(tenant, endpoint): the freeze that makes a claim of the
 * endpoint answer "frozen" now (reason, until), or no row: what a client
 * tells its caller (503, Retry-After).  Open to every role: a bound role
 * asks about its own tenant only.
 */
Datum
idem_frozen(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *tenant = key_part_from_arg(fcinfo, 0, "tenant");
	text	   *endpoint = key_part_from_arg(fcinfo, 1, "endpoint");
	Freeze	   *f;
	Datum		values[2];
	bool		nulls[2];

	tenant_check(tenant);
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 2)
		elog(ERROR, "incorrect number of output arguments");
	f = freeze_of(tenant, endpoint, GetCurrentTimestamp());
	if (f == NULL)
		return (Datum) 0;
	nulls[0] = f->reason == NULL;
	values[0] = f->reason != NULL ? PointerGetDatum(f->reason) : (Datum) 0;
	nulls[1] = f->until == DT_NOEND;
	values[1] = TimestampTzGetDatum(f->until);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * The statement trigger of idem_freeze: every backend reads the table
 * again before its next claim once this transaction commits
 */
Datum
idem_freeze_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_freeze_changed\" was not called by trigger manager")));
	CacheInvalidateRelcache(trigdata->tg_relation);
	return PointerGetDatum(NULL);
}
