/*-------------------------------------------------------------------------
 *
 * pause.c
 *	  Pausing an outbox topic (0.4.0): the engineer on call stops every
 *	  dispatcher's deliveries of a topic (of one tenant, or of all) at
 *	  once, without stopping the dispatchers or the business transactions.
 *
 * A pause is a row of idem_pause (topic, tenant; tenant NULL for every
 * tenant).  idem_take reads the topic's pauses once per call, under its
 * own statement's snapshot, and leases nothing that a pause holds; enqueues
 * go on committing, and the messages are taken once the topic is resumed.
 * A take that began before the pause committed may still lease; every
 * take after it leases nothing.  The functions reach the table through SQL
 * as its owner, after checking the tenant binding as the caller: a bound
 * role pauses and resumes its own tenant's messages only (tenant NULL
 * meaning its own).  In a database whose SQL objects are older than
 * 0.4.0's there is no table, and nothing is paused.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "access.h"
#include "args.h"
#include "pause.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_pause);
PG_FUNCTION_INFO_V1(idem_resume);

/*
 * Switch to idem_pause's owner and connect to SPI; false, doing nothing,
 * when this database has no idem_pause
 */
static bool
pause_enter(AccessAsOwner *a)
{
	return OidIsValid(access_sql_enter_table(a, "idem_pause"));
}

/*
 * The tenants whose messages of topic are paused, in the caller's memory;
 * *all when every tenant's are
 */
List *
pause_tenants(text *topic, bool *all)
{
	MemoryContext caller = CurrentMemoryContext;
	AccessAsOwner a;
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	List	   *tenants = NIL;

	*all = false;
	if (!pause_enter(&a))
		return NIL;
	values[0] = PointerGetDatum(topic);
	(void) access_run_sql("SELECT p.tenant FROM idem_pause p"
						  " WHERE p.topic OPERATOR(pg_catalog.=) $1",
						  1, argtypes, values, true, SPI_OK_SELECT);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i],
									  SPI_tuptable->tupdesc, 1, &isnull);
		MemoryContext old;

		if (isnull)
		{
			*all = true;
			continue;
		}
		old = MemoryContextSwitchTo(caller);
		tenants = lappend(tenants, DatumGetTextPCopy(d));
		MemoryContextSwitchTo(old);
	}
	access_sql_leave(&a);
	return tenants;
}

/* Whether paused, from pause_tenants, holds tenant's messages */
bool
pause_holds(List *paused, text *tenant)
{
	ListCell   *lc;

	foreach(lc, paused)
	{
		text	   *t = (text *) lfirst(lc);

		if (VARSIZE_ANY_EXHDR(t) == VARSIZE_ANY_EXHDR(tenant) &&
			memcmp(VARDATA_ANY(t), VARDATA_ANY(tenant),
				   VARSIZE_ANY_EXHDR(t)) == 0)
			return true;
	}
	return false;
}

/*
 * The topic and tenant arguments of idem_pause and idem_resume: the tenant
 * a bound role names must be its own, and NULL means its own
 */
static void
topic_tenant_from_args(FunctionCallInfo fcinfo, Datum *values, char *nulls)
{
	text	   *tenant;

	values[0] = PointerGetDatum(key_part_from_arg(fcinfo, 0, "topic"));
	if (!PG_ARGISNULL(1))
	{
		tenant = check_key_part(PG_GETARG_TEXT_PP(1), "tenant");
		tenant_check(tenant);
	}
	else
		tenant = tenant_bound();
	values[1] = PointerGetDatum(tenant);
	nulls[0] = ' ';
	nulls[1] = tenant != NULL ? ' ' : 'n';
}

/* Run a statement on idem_pause as its owner; how many rows it changed */
static uint64
pause_write(const char *sql, Datum *values, char *nulls)
{
	AccessAsOwner a;
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	SPIPlanPtr	plan;
	uint64		changed;

	if (!pause_enter(&a))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"idem_pause\" of extension \"idem\" does not exist in this database"),
				 errhint("Run ALTER EXTENSION idem UPDATE in this database.")));
	plan = SPI_prepare(sql, 2, argtypes);
	if (plan == NULL ||
		SPI_execute_plan(plan, values, nulls, false, 0) < 0)
		elog(ERROR, "SPI_execute_plan failed: %s",
			 SPI_result_code_string(SPI_result));
	changed = SPI_processed;
	access_sql_leave(&a);
	return changed;
}

/*
 * idem_pause(topic, tenant): the topic's messages (of tenant, or of every
 * tenant for NULL) are taken by no dispatcher until idem_resume; true if
 * this call paused them, false if they were paused already
 */
Datum
idem_pause(PG_FUNCTION_ARGS)
{
	Datum		values[2];
	char		nulls[2];

	topic_tenant_from_args(fcinfo, values, nulls);
	PG_RETURN_BOOL(pause_write("INSERT INTO idem_pause (topic, tenant, paused_at)"
							   " VALUES ($1, $2, pg_catalog.now())"
							   " ON CONFLICT DO NOTHING",
							   values, nulls) == 1);
}

/* idem_resume(topic, tenant): lift that pause; true if there was one */
Datum
idem_resume(PG_FUNCTION_ARGS)
{
	Datum		values[2];
	char		nulls[2];

	topic_tenant_from_args(fcinfo, values, nulls);
	PG_RETURN_BOOL(pause_write("DELETE FROM idem_pause p"
							   " WHERE p.topic OPERATOR(pg_catalog.=) $1"
							   " AND p.tenant IS NOT DISTINCT FROM $2",
							   values, nulls) == 1);
}
