/*-------------------------------------------------------------------------
 *
 * purge.c
 *	  Deleting expired records, shared by idem_purge() and the worker.
 *
 * A record is forgotten once its expires_at has passed whether or not it
 * has been purged yet (every function treats it as absent), so purging only
 * gives the space back.  Each batch deletes at most idem.purge_batch rows
 * with FOR UPDATE SKIP LOCKED: it never waits for a transaction that holds
 * a row, and the worker commits after every batch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "idem.h"

/*
 * Delete one batch of records expired by now; returns how many.  *from is
 * where the batch starts in expiry order, DT_NOBEGIN for a purge's first
 * batch, and is moved on for the next one.
 */
uint64
purge_batch(TimestampTz now, TimestampTz *from)
{
	uint64		deleted;

	record_open();
	deleted = record_purge_batch(now, idem_purge_batch, from);
	record_close();
	return deleted;
}

/*
 * idem_purge(): every expired record, batch after batch, in the caller's
 * transaction.
 */
uint64
purge_all(void)
{
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz now = GetCurrentStatementStartTimestamp();
	TimestampTz from = DT_NOBEGIN;
	uint64		total = 0;
	uint64		deleted;

	require_primary("idem_purge()");
	do
	{
		CHECK_FOR_INTERRUPTS();
		deleted = purge_batch(now, &from);
		total += deleted;
	} while (deleted == (uint64) idem_purge_batch);
	stats_count_purge(total, start, GetCurrentTimestamp(), false);
	return total;
}
