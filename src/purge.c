/*-------------------------------------------------------------------------
 *
 * purge.c
 *	  Deleting expired records, shared by idem_purge() and the worker.
 *
 * A record is forgotten once its expires_at has passed whether or not it
 * has been purged yet (every function treats it as absent), so purging only
 * gives the space back, and a purge may leave any record for a later one.
 * It never waits for another transaction: each batch deletes at most
 * idem.purge_batch rows with FOR UPDATE SKIP LOCKED, so it never waits for
 * a transaction that holds a row; and it first takes, without waiting, the
 * rows of the fencing floor that its AFTER DELETE trigger will raise,
 * leaving the records of a bucket that another transaction holds (an
 * operator's idem_forget left open) for a later purge (sql_purge_batch).
 * The rows it deletes are thus never kept "being deleted" for as long as
 * someone else's transaction lasts, and the worker commits after every
 * batch.
 *
 * Finished outbox messages (delivered, dead) are purged by the same calls
 * once idem.outbox_retention has passed since they finished
 * (outbox_purge_batch), but on a subscriber that receives idem_outbox, and
 * so are expired budgets (budget_purge_batch): purge_others.
 *
 * On Citus each node purges the shard placements of idem_record it holds
 * (record_purge_targets), its worker as everywhere else; idem_purge() on
 * the coordinator also runs idem_purge() on every worker node and adds up
 * what they deleted.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "budget.h"
#include "outbox.h"
#include "protocol.h"
#include "purge.h"
#include "record.h"
#include "settings.h"
#include "stats.h"

/*
 * What is purged besides the records, each a batch at a time: finished
 * outbox messages and expired budgets
 */
const PurgeOther purge_others[2] = {
	{outbox_purge_batch, "purging finished outbox messages"},
	{budget_purge_batch, "purging expired budgets"},
};

/*
 * The relations to purge on this node (record_purge_targets), in the
 * current memory context; *distributed tells whether Citus distributes
 * idem_record.
 */
List *
purge_targets(bool *distributed)
{
	RecordAccess *ra = record_open(NULL);
	List	   *targets;

	targets = record_purge_targets(ra, distributed);
	record_close(ra);
	return targets;
}

/*
 * Delete one batch of target's records expired by now; returns how many.
 * *scan is where the batch starts ({.from = DT_NOBEGIN} for a target's
 * first batch), and is moved on for the next one; *more tells whether
 * another batch may find more.
 */
uint64
purge_batch(Oid target, TimestampTz now, IdemPurgeScan *scan, bool *more)
{
	RecordAccess *ra = record_open(NULL);
	uint64		deleted;

	deleted = record_purge_batch(ra, target, now, idem_purge_batch, scan,
								 more);
	record_close(ra);
	return deleted;
}

/*
 * On the Citus coordinator: idem_purge() on every worker node, each of
 * which purges the placements it holds; the sum of what they deleted.
 * Citus runs the calls over connections of their own, so each node's purge
 * commits on its own, whatever becomes of the caller's transaction.  A node
 * that fails makes the whole call fail, naming it.
 */
static uint64
purge_worker_nodes(void)
{
	uint64		total = 0;
	bool		isnull;
	int			nestlevel;
	int			rc;

	/* Citus's own SQL functions run under the caller's path otherwise */
	nestlevel = settings_pin_search_path(InvalidOid);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute("SELECT pg_catalog.citus_is_coordinator()", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull)))
	{
		SPI_finish();
		AtEOXact_GUC(true, nestlevel);
		return 0;
	}

	rc = SPI_execute("SELECT nodename, nodeport, success, result"
					 " FROM pg_catalog.run_command_on_workers(pg_catalog.format("
					 "'SELECT %s.idem_purge()',"
					 " (SELECT e.extnamespace::pg_catalog.regnamespace"
					 " FROM pg_catalog.pg_extension e"
					 " WHERE e.extname OPERATOR(pg_catalog.=) 'idem')))",
					 false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *result = SPI_getvalue(row, desc, 4);

		if (!DatumGetBool(SPI_getbinval(row, desc, 3, &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("idem_purge() failed on Citus node %s:%s",
							SPI_getvalue(row, desc, 1),
							SPI_getvalue(row, desc, 2)),
					 errdetail("The node answered: %s", result ? result : "")));
		total += (uint64) pg_strtoint64(result);
	}
	SPI_finish();
	AtEOXact_GUC(true, nestlevel);
	return total;
}

/*
 * idem_purge(): every expired record, batch after batch, in the caller's
 * transaction, but those of a floor bucket that another transaction holds;
 * on a Citus coordinator, those of every node.
 */
uint64
purge_all(void)
{
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz now = GetCurrentStatementStartTimestamp();
	uint64		total = 0;
	bool		distributed;
	List	   *targets;
	ListCell   *lc;

	require_primary("idem_purge()");
	targets = purge_targets(&distributed);
	foreach(lc, targets)
	{
		IdemPurgeScan scan = {.from = DT_NOBEGIN};
		bool		more;

		do
		{
			CHECK_FOR_INTERRUPTS();
			total += purge_batch(lfirst_oid(lc), now, &scan, &more);
		} while (more);
	}
	for (int i = 0; i < (int) lengthof(purge_others); i++)
	{
		bool		more;

		do
		{
			CHECK_FOR_INTERRUPTS();
			total += purge_others[i].batch(now, idem_purge_batch, &more);
		} while (more);
	}
	stats_count_purge(total, start, GetCurrentTimestamp(), false, 0);
	if (distributed)
		total += purge_worker_nodes();
	return total;
}
