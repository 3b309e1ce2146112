/*-------------------------------------------------------------------------
 *
 * budget.c
 *	  Retry budgets (0.4.0): one per tenant and task, spent by every layer
 *	  that retries the task's work, so that nested retries (a tool's, an
 *	  agent loop's, a job runner's) stop together.
 *
 * The table is idem_budget; these functions reach it through SQL, as the
 * table's owner, after checking the tenant binding as the caller (a check
 * made after the switch would see the owner).  Why it is correct:
 * - Creating a budget is an INSERT ... ON CONFLICT: the primary key decides
 *   between two creations of one task, and the loser answers the budget
 *   the winner made (or, asking for another total, is refused).  An expired
 *   budget is replaced, as an expired record is claimed anew.
 * - A spend is one UPDATE whose WHERE clause says that the budget can cover
 *   it.  Concurrent spends queue for the row's lock; under READ COMMITTED
 *   each re-evaluates the clause against the version the one before it
 *   left, so the spends that succeed never add up past the total, whatever
 *   their interleaving; under REPEATABLE READ the second fails with 40001.
 *   Nothing is read first and written after.  A spend that rolls back
 *   leaves the row as it was.
 * - A spend that cannot be covered spends nothing and errors with IB001, a
 *   SQLSTATE of its own, naming the task, what was spent and the total.
 *
 * Expired budgets are deleted by the purge (budget_purge_batch), like
 * finished outbox messages.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "access.h"
#include "args.h"
#include "budget.h"
#include "protocol.h"
#include "settings.h"
#include "subscription.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_budget);
PG_FUNCTION_INFO_V1(idem_spend);

/* The SQLSTATE of a spend the budget cannot cover */
#define ERRCODE_IDEM_BUDGET_SPENT	MAKE_SQLSTATE('I','B','0','0','1')

/*
 * Switch to the table's owner, pin the path and connect to SPI.  For the
 * purge (function, the caller's name, NULL): false, without doing any of
 * it, when this database has no idem_budget or a subscription receives it;
 * for a call, an error then.
 */
static bool
budget_enter(AccessAsOwner *bc, const char *function)
{
	Oid			relid = access_sql_enter_table(bc, "idem_budget");

	if (!OidIsValid(relid))
	{
		if (function == NULL)
			return false;
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"idem_budget\" of extension \"idem\" does not exist in this database"),
				 errhint("Run ALTER EXTENSION idem UPDATE in this database.")));
	}
	if (function != NULL)
		require_primary_for(function, relid, "idem_budget");
	else if (OidIsValid(subscription_of(relid)))
	{
		access_sql_leave(bc);
		return false;			/* its publisher purges it */
	}
	return true;
}

/* Column c (from 1) of the first row SPI returned, an int4 */
static int32
first_int(int c)
{
	bool		isnull;

	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, c, &isnull));
}

/*
 * The arguments both functions begin with, as the statements' parameters
 * $1 to $4: the tenant and the task (the binding checked, as the caller),
 * a count of attempts (argument 2, named name) and the current time, as
 * a claim reads it (a long transaction must not date a budget in the past)
 */
static void
budget_args(FunctionCallInfo fcinfo, const char *name, Datum *values)
{
	text	   *tenant = key_part_from_arg(fcinfo, 0, "tenant");

	values[1] = PointerGetDatum(key_part_from_arg(fcinfo, 1, "task"));
	values[2] = Int32GetDatum(positive_from_arg(fcinfo, 2, name));
	tenant_check(tenant);
	values[0] = PointerGetDatum(tenant);
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
}

/*
 * idem_budget(tenant, task, attempts, ttl): the task's budget of attempts,
 * created unless it exists; what is left of it.  Another total for a live
 * budget is refused (22023): two layers disagreeing on a task's budget is
 * a bug that a silent answer would hide.
 */
Datum
idem_budget(PG_FUNCTION_ARGS)
{
	Oid			argtypes[5] = {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID};
	Datum		values[5];
	TimestampTz now;
	TimestampTz expires;
	AccessAsOwner bc;
	int32		total;
	int32		spent;

	budget_args(fcinfo, "attempts", values);
	require_not_null(fcinfo, 3, "ttl");
	now = DatumGetTimestampTz(values[3]);
	expires = protocol_time_plus(now, PG_GETARG_INTERVAL_P(3), "ttl");
	if (expires <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive")));
	values[4] = TimestampTzGetDatum(expires);

	(void) budget_enter(&bc, "idem_budget()");
	/* a live budget is locked and kept; an expired one is replaced */
	if (access_run_sql("INSERT INTO idem_budget AS b"
					   " (tenant, task, total, spent, created_at, expires_at)"
					   " VALUES ($1, $2, $3, 0, $4, $5)"
					   " ON CONFLICT (tenant, task) DO UPDATE"
					   " SET total = excluded.total, spent = 0,"
					   " created_at = excluded.created_at,"
					   " expires_at = excluded.expires_at"
					   " WHERE b.expires_at OPERATOR(pg_catalog.<=) excluded.created_at"
					   " RETURNING b.total, b.spent",
					   5, argtypes, values, false, SPI_OK_INSERT_RETURNING) == 0)
		(void) access_run_sql("SELECT b.total, b.spent FROM idem_budget b"
							  " WHERE b.tenant OPERATOR(pg_catalog.=) $1"
							  " AND b.task OPERATOR(pg_catalog.=) $2",
							  2, argtypes, values, false, SPI_OK_SELECT);
	if (SPI_processed != 1)
		elog(ERROR, "idem_budget() found no budget after its insert");
	total = first_int(1);
	spent = first_int(2);
	access_sql_leave(&bc);
	if (total != DatumGetInt32(values[2]))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem budget of task \"%s\" has %d attempts, not %d",
						TextDatumGetCString(values[1]), total,
						DatumGetInt32(values[2])),
				 errdetail("A task's budget is created once; every layer asks for the same total.")));
	PG_RETURN_INT32(total - spent);
}

/*
 * idem_spend(tenant, task, n): spend n attempts of the task's budget in
 * the caller's transaction; what is left.  See the file's header.
 */
Datum
idem_spend(PG_FUNCTION_ARGS)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID};
	Datum		values[4];
	AccessAsOwner bc;
	int32		left;
	int32		total;
	int32		spent;
	int32		n;

	budget_args(fcinfo, "n", values);
	n = DatumGetInt32(values[2]);
	(void) budget_enter(&bc, "idem_spend()");
	if (access_run_sql("UPDATE idem_budget b"
					   " SET spent = b.spent OPERATOR(pg_catalog.+) $3"
					   " WHERE b.tenant OPERATOR(pg_catalog.=) $1"
					   " AND b.task OPERATOR(pg_catalog.=) $2"
					   " AND b.expires_at OPERATOR(pg_catalog.>) $4"
					   " AND b.spent OPERATOR(pg_catalog.<=)"
					   " (b.total OPERATOR(pg_catalog.-) $3)"
					   " RETURNING b.total OPERATOR(pg_catalog.-) b.spent",
					   4, argtypes, values, false, SPI_OK_UPDATE_RETURNING) == 1)
	{
		left = first_int(1);
		access_sql_leave(&bc);
		PG_RETURN_INT32(left);
	}

	/* why not: no live budget, or not enough left (as of now) */
	(void) access_run_sql("SELECT b.total, b.spent FROM idem_budget b"
						  " WHERE b.tenant OPERATOR(pg_catalog.=) $1"
						  " AND b.task OPERATOR(pg_catalog.=) $2"
						  " AND b.expires_at OPERATOR(pg_catalog.>) $4",
						  4, argtypes, values, false, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("idem budget of task \"%s\" does not exist",
						TextDatumGetCString(values[1])),
				 errdetail("It was never created for tenant \"%s\", or it expired.",
						   TextDatumGetCString(values[0])),
				 errhint("Create it with idem_budget().")));
	total = first_int(1);
	spent = first_int(2);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_BUDGET_SPENT),
			 errmsg("idem budget of task \"%s\" cannot cover %d more attempt%s",
					TextDatumGetCString(values[1]), n, n == 1 ? "" : "s"),
			 errdetail("It has spent %d of its %d attempts.", spent, total),
			 errhint("Stop retrying the task, and report it.")));
	PG_RETURN_NULL();			/* not reached */
}

/*
 * One purge batch of expired budgets, without waiting for a transaction
 * that holds one; false in *more when it deleted less than batch.  A
 * database whose SQL objects are older than 0.4.0's has none.
 */
uint64
budget_purge_batch(TimestampTz now, int batch, bool *more)
{
	AccessAsOwner bc;
	uint64		deleted;

	*more = false;
	if (!budget_enter(&bc, NULL))
		return 0;
	deleted = access_run_purge("DELETE FROM idem_budget d"
							   " WHERE (d.tenant, d.task) IN ("
							   "SELECT b.tenant, b.task FROM idem_budget b"
							   " WHERE b.expires_at OPERATOR(pg_catalog.<) $1"
							   " ORDER BY b.expires_at LIMIT $2"
							   " FOR UPDATE SKIP LOCKED)",
							   now, batch, more);
	access_sql_leave(&bc);
	return deleted;
}
