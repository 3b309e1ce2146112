/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory counters of what idem does, per database, and the
 *	  idem_stats view's functions.
 *
 * Each database gets a slot the first time one of its backends counts
 * something; a backend looks its slot up once and keeps a pointer to it, so
 * counting is one atomic add, with no lock held, never across SPI.  The
 * slot table is fixed in size (IDEM_STATS_DATABASES); a database beyond it
 * is not counted.  Slots are never given back while the server runs: a
 * backend keeps its pointer for its whole life.
 *
 * The counters exist only with idem in shared_preload_libraries.  Without
 * it counting does nothing and reading the counters is an error that says
 * so.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "stats.h"

/* How many databases have counters */
#define IDEM_STATS_DATABASES	256

typedef enum IdemCounter
{
	/* claims by outcome come first, indexed by IdemOutcome up to unknown */
	CTR_COMPLETES = IDEM_UNKNOWN + 1,
	CTR_FAILS,
	CTR_FAILS_RETRYABLE,
	CTR_RELEASES,
	CTR_PURGED,
	CTR_LAST_PURGE,				/* TimestampTz of the last purge visit */
	CTR_LAST_PURGE_US,			/* its duration in microseconds */
	CTR_RESET,					/* TimestampTz of the last reset */
	CTR_FROZEN,					/* claims answered frozen (0.4.0: last, so
								 * that older objects' columns stay put) */
	NUM_COUNTERS
} IdemCounter;

typedef struct IdemDbStats
{
	Oid			dbid;			/* InvalidOid: free; set under the lock */
	pg_atomic_uint32 purge_backlog; /* the last purge visit left work: 1 +
									 * the pause (ms) it still owed */
	pg_atomic_uint64 counters[NUM_COUNTERS];
} IdemDbStats;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* protects slot assignment */
	IdemDbStats slots[IDEM_STATS_DATABASES];
} IdemStatsShared;

static IdemStatsShared *shared = NULL;
static IdemDbStats *my_slot = NULL;
static bool my_slot_looked_up = false;

/* Called from idem.c's shmem_request_hook */
void
stats_shmem_request(void)
{
	RequestAddinShmemSpace(sizeof(IdemStatsShared));
	RequestNamedLWLockTranche("idem", 1);
}

/* Called from idem.c's shmem_startup_hook */
void
stats_shmem_startup(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("idem stats", sizeof(IdemStatsShared), &found);
	if (!found)
	{
		shared->lock = &(GetNamedLWLockTranche("idem"))->lock;
		for (int i = 0; i < IDEM_STATS_DATABASES; i++)
		{
			shared->slots[i].dbid = InvalidOid;
			pg_atomic_init_u32(&shared->slots[i].purge_backlog, 0);
			for (int c = 0; c < NUM_COUNTERS; c++)
				pg_atomic_init_u64(&shared->slots[i].counters[c], 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

static IdemDbStats *
find_slot(Oid dbid)
{
	for (int i = 0; i < IDEM_STATS_DATABASES; i++)
		if (shared->slots[i].dbid == dbid)
			return &shared->slots[i];
	return NULL;
}

/*
 * The slot of a database, assigned on first use; NULL without preloading
 * or when every slot is taken.
 */
static IdemDbStats *
slot_for(Oid dbid, bool create)
{
	IdemDbStats *slot;

	if (shared == NULL)
		return NULL;

	LWLockAcquire(shared->lock, LW_SHARED);
	slot = find_slot(dbid);
	LWLockRelease(shared->lock);
	if (slot != NULL || !create)
		return slot;

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	slot = find_slot(dbid);
	if (slot == NULL && (slot = find_slot(InvalidOid)) != NULL)
	{
		slot->dbid = dbid;
		pg_atomic_write_u64(&slot->counters[CTR_RESET],
							(uint64) GetCurrentTimestamp());
	}
	LWLockRelease(shared->lock);
	return slot;
}

static void
count(IdemCounter counter, uint64 n)
{
	if (!my_slot_looked_up)
	{
		my_slot = slot_for(MyDatabaseId, true);
		my_slot_looked_up = true;
	}
	if (my_slot != NULL)
		pg_atomic_fetch_add_u64(&my_slot->counters[counter], n);
}

void
stats_count_claim(IdemOutcome outcome)
{
	count(outcome == IDEM_FROZEN ? CTR_FROZEN : (IdemCounter) outcome, 1);
}

void
stats_count_finish(IdemFinish how)
{
	static const IdemCounter counters[] = {
		[IDEM_FINISH_COMPLETE] = CTR_COMPLETES,
		[IDEM_FINISH_FAIL] = CTR_FAILS,
		[IDEM_FINISH_FAIL_RETRYABLE] = CTR_FAILS_RETRYABLE,
		[IDEM_FINISH_RELEASE] = CTR_RELEASES
	};

	count(counters[how], 1);
}

/*
 * A purge visit of this database deleted rows from start to end, and left
 * work or not (backlog); owed_ms is the pause it owed when its time was up
 * (worker.c's pacing)
 */
void
stats_count_purge(uint64 rows, TimestampTz start, TimestampTz end,
				  bool backlog, long owed_ms)
{
	count(CTR_PURGED, rows);
	if (my_slot == NULL)
		return;
	pg_atomic_write_u64(&my_slot->counters[CTR_LAST_PURGE], (uint64) end);
	pg_atomic_write_u64(&my_slot->counters[CTR_LAST_PURGE_US],
						(uint64) (end - start));
	pg_atomic_write_u32(&my_slot->purge_backlog,
						backlog ? 1 + (uint32) Min(Max(owed_ms, 0), INT_MAX) : 0);
}

/* Forget what the last purge visit of a database left (worker.c) */
void
stats_clear_purge_backlog(Oid dbid)
{
	IdemDbStats *slot = slot_for(dbid, false);

	if (slot != NULL)
		pg_atomic_write_u32(&slot->purge_backlog, 0);
}

/*
 * Whether the last purge visit of a database stopped with expired records
 * left; the launcher then visits again without waiting an interval, but
 * for the pause that visit still owed (*owed_ms).
 */
bool
stats_purge_backlog(Oid dbid, long *owed_ms)
{
	IdemDbStats *slot = slot_for(dbid, false);
	uint32		backlog = slot == NULL ? 0 :
		pg_atomic_read_u32(&slot->purge_backlog);

	*owed_ms = backlog == 0 ? 0 : (long) (backlog - 1);
	return backlog != 0;
}

static void
require_shared(void)
{
	if (shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem statistics need idem in shared_preload_libraries"),
				 errhint("Add idem to shared_preload_libraries and restart the server.")));
}

PG_FUNCTION_INFO_V1(idem_stats_read);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * One row per database that has counted something.  Columns follow the
 * IdemCounter order, as declared in the install script; objects older than
 * 0.4.0's have no claims_frozen column.  The slots are
 * read under the lock that assigns them, shared, so that no slot changes
 * database while it is read; the counters themselves are atomics, read as
 * they are.
 */
Datum
idem_stats_read(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	require_shared();
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 1 + NUM_COUNTERS &&
		rsinfo->setDesc->natts != NUM_COUNTERS)
		elog(ERROR, "incorrect number of output arguments");

	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < IDEM_STATS_DATABASES; i++)
	{
		IdemDbStats *slot = &shared->slots[i];
		Datum		values[1 + NUM_COUNTERS];
		bool		nulls[1 + NUM_COUNTERS] = {false};
		uint64		v[NUM_COUNTERS];

		if (slot->dbid == InvalidOid)
			continue;
		for (int c = 0; c < NUM_COUNTERS; c++)
			v[c] = pg_atomic_read_u64(&slot->counters[c]);

		values[0] = ObjectIdGetDatum(slot->dbid);
		for (int c = 0; c < CTR_LAST_PURGE; c++)
			values[1 + c] = Int64GetDatum((int64) v[c]);
		values[1 + CTR_LAST_PURGE] = TimestampTzGetDatum((TimestampTz) v[CTR_LAST_PURGE]);
		nulls[1 + CTR_LAST_PURGE] = v[CTR_LAST_PURGE] == 0;
		values[1 + CTR_LAST_PURGE_US] = Float8GetDatum(v[CTR_LAST_PURGE_US] / 1000.0);
		nulls[1 + CTR_LAST_PURGE_US] = v[CTR_LAST_PURGE] == 0;
		values[1 + CTR_RESET] = TimestampTzGetDatum((TimestampTz) v[CTR_RESET]);
		values[1 + CTR_FROZEN] = Int64GetDatum((int64) v[CTR_FROZEN]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	LWLockRelease(shared->lock);
	return (Datum) 0;
}

/* Zero every database's counters; slots stay where they are */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();

	require_shared();
	for (int i = 0; i < IDEM_STATS_DATABASES; i++)
	{
		IdemDbStats *slot = &shared->slots[i];

		for (int c = 0; c < NUM_COUNTERS; c++)
			pg_atomic_write_u64(&slot->counters[c], 0);
		pg_atomic_write_u64(&slot->counters[CTR_RESET], (uint64) now);
	}
	PG_RETURN_VOID();
}
