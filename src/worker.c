/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The background purge: a launcher and short-lived per-database workers.
 *
 * A background worker is bound to one database for its whole life, and a
 * worker that stays connected to a database would make DROP DATABASE fail.
 * So the launcher, connected to no database, lists the databases every
 * idem.purge_interval and, one after the other, starts a worker in each.
 * That worker leaves at once where idem is not installed or where a
 * logical-replication subscription receives idem_record (the publisher's
 * purge deletes the records there: subscription.c), and otherwise
 * purges expired records batch after batch, one transaction per batch,
 * pausing in proportion to their time (idem.purge_pause), for at most
 * IDEM_PURGE_VISIT_MS, then exits.  A worker that had to stop with
 * expired records left says so (stats.c), and the launcher comes back
 * without waiting an interval, but for the pause that visit still owed.  A
 * database created or dropped later is visited or left out at the next
 * round, and DROP DATABASE, which waits a few seconds for other sessions
 * to leave, never finds a purge in its way for longer than one visit.
 *
 * The purge itself never waits for a row or a bucket of the fencing floor
 * (purge.c), but a worker may still have to wait for a lock of a whole
 * table (an operator's LOCK TABLE, an ALTER TABLE), for as long as that
 * transaction lasts.  So the launcher waits for a worker only until
 * IDEM_PURGE_VISIT_WAIT_MS have passed, then goes on to the next database,
 * and leaves the database of a worker still running out of its next rounds
 * until that worker has ended: one database's stuck purge never stops the
 * others', and holds one worker process at most.
 *
 * On Citus, a worker purges the shard placements of idem_record that its
 * node holds, one after the other (record_purge_targets).
 *
 * The launcher starts once recovery has finished: never on a standby, and
 * on a standby's promotion.  SIGTERM ends either process (die); the
 * postmaster restarts the launcher after IDEM_LAUNCHER_RESTART_S.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_subscription.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "purge.h"
#include "settings.h"
#include "stats.h"
#include "subscription.h"
#include "worker.h"

/* Longest stay of one purge worker in its database */
#define IDEM_PURGE_VISIT_MS		1000

/* Longest wait of the launcher for one database's worker */
#define IDEM_PURGE_VISIT_WAIT_MS	(2 * IDEM_PURGE_VISIT_MS)

/* Seconds before the postmaster restarts a launcher that exited */
#define IDEM_LAUNCHER_RESTART_S	5

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_purge_main(Datum main_arg);

/* A worker that the launcher stopped waiting for, still running perhaps */
typedef struct Straggler
{
	Oid			dboid;
	BackgroundWorkerHandle *handle;
} Straggler;

/* The launcher's stragglers, in TopMemoryContext */
static List *stragglers = NIL;

/*
 * The launcher's waits, as pg_stat_activity names them (17+): for a
 * database's purge worker to finish (IdemLauncherWorker), and between two
 * rounds (IdemLauncherSleep)
 */
static uint32
launcher_wait_event(const char *name)
{
	static uint32 worker_event = 0;
	static uint32 sleep_event = 0;
	uint32	   *event = strcmp(name, "IdemLauncherWorker") == 0 ?
		&worker_event : &sleep_event;

	if (*event == 0)
		*event = idem_wait_event(name);
	return *event;
}

static void
fill_worker(BackgroundWorker *bgw, const char *function, const char *type)
{
	memset(bgw, 0, sizeof(*bgw));
	bgw->bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw->bgw_start_time = BgWorkerStart_RecoveryFinished;
	snprintf(bgw->bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(bgw->bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(bgw->bgw_name, BGW_MAXLEN, "%s", type);
	snprintf(bgw->bgw_type, BGW_MAXLEN, "%s", type);
}

/* Called from _PG_init while the library is being preloaded */
void
worker_register_launcher(void)
{
	BackgroundWorker bgw;

	fill_worker(&bgw, "idem_launcher_main", "idem purge launcher");
	bgw.bgw_restart_time = IDEM_LAUNCHER_RESTART_S;
	RegisterBackgroundWorker(&bgw);
}

/* The OIDs of the databases a worker may connect to */
static List *
list_databases(void)
{
	List	   *result = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	MemoryContext caller = CurrentMemoryContext;

	/* a transaction and a snapshot to read pg_database with */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);
		MemoryContext old;

		if (!db->datallowconn || db->datistemplate)
			continue;
		/* the list must outlive the transaction */
		old = MemoryContextSwitchTo(caller);
		result = lappend_oid(result, db->oid);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();
	return result;
}

/*
 * Forget the stragglers that have ended; true if dboid's worker still runs
 * (or has not started yet).
 */
static bool
sweep_stragglers(Oid dboid)
{
	bool		running = false;
	ListCell   *lc;

	foreach(lc, stragglers)
	{
		Straggler  *s = (Straggler *) lfirst(lc);
		pid_t		pid;

		if (GetBackgroundWorkerPid(s->handle, &pid) == BGWH_STOPPED)
		{
			pfree(s->handle);
			pfree(s);
			stragglers = foreach_delete_current(stragglers, lc);
		}
		else if (s->dboid == dboid)
			running = true;
	}
	return running;
}

/*
 * Wait for a worker to end, for IDEM_PURGE_VISIT_WAIT_MS at most; true if
 * it ended.  The postmaster sets the launcher's latch when the worker ends
 * (bgw_notify_pid).
 */
static bool
wait_for_worker(BackgroundWorkerHandle *handle)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   IDEM_PURGE_VISIT_WAIT_MS);

	for (;;)
	{
		pid_t		pid;
		long		remaining;

		if (GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED)
			return true;
		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
													deadline);
		if (remaining <= 0)
			return false;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 remaining, launcher_wait_event("IdemLauncherWorker"));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Run one purge worker in a database and wait until it is done, or until
 * the wait's bound: true if it ended then.  A database whose worker of an
 * earlier round still runs gets no second one.
 */
static bool
visit_database(Oid dboid)
{
	BackgroundWorker bgw;
	BackgroundWorkerHandle *handle;
	pid_t		pid;
	MemoryContext old;
	Straggler  *s;

	if (sweep_stragglers(dboid))
		return false;

	/*
	 * Only a visit that reports leaves a backlog: one that ends without (idem
	 * dropped meanwhile, an error, a SIGTERM) must not leave an earlier
	 * visit's, which would send the launcher round again at once, forever
	 */
	stats_clear_purge_backlog(dboid);
	fill_worker(&bgw, "idem_purge_main", "idem purge");
	snprintf(bgw.bgw_name, BGW_MAXLEN, "idem purge of database %u", dboid);
	bgw.bgw_restart_time = BGW_NEVER_RESTART;
	bgw.bgw_main_arg = ObjectIdGetDatum(dboid);
	bgw.bgw_notify_pid = MyProcPid;

	old = MemoryContextSwitchTo(TopMemoryContext);
	if (!RegisterDynamicBackgroundWorker(&bgw, &handle))
	{
		MemoryContextSwitchTo(old);
		ereport(LOG,
				(errmsg("idem could not start a purge worker for database %u", dboid),
				 errhint("Raise max_worker_processes.")));
		return false;
	}
	MemoryContextSwitchTo(old);
	if (WaitForBackgroundWorkerStartup(handle, &pid) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	if (wait_for_worker(handle))
	{
		pfree(handle);
		return true;
	}

	s = MemoryContextAlloc(TopMemoryContext, sizeof(Straggler));
	s->dboid = dboid;
	s->handle = handle;
	old = MemoryContextSwitchTo(TopMemoryContext);
	stragglers = lappend(stragglers, s);
	MemoryContextSwitchTo(old);
	return false;
}

/*
 * What a visit purges: what expired at least one purge interval before
 * now.  A record or message is forgotten once it expires, purged or not,
 * so this only gives the space back up to one interval later; and it
 * leaves what expired a moment ago to an explicit idem_purge() (an
 * operator's, a test suite's on a server configured for production), so
 * that the worker never takes those rows from under it.
 */
static TimestampTz
purge_cutoff(TimestampTz now)
{
	return now - (TimestampTz) idem_purge_interval * 1000;
}

/*
 * Sleep for ms (idem.purge_interval, or the pause a purge still owes), or
 * until a reload, which may change it.  A straggler that ends meanwhile
 * sets the latch too; it is no reason for an early round.
 */
static void
sleep_interval(long ms)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);
	long		remaining;

	while (!ConfigReloadPending &&
		   (remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
														end)) > 0)
	{
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 remaining, launcher_wait_event("IdemLauncherSleep"));
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

void
idem_launcher_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* no database: the launcher reads only the shared catalog pg_database */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	for (;;)
	{
		List	   *databases;
		ListCell   *lc;
		bool		backlog = false;
		long		owed_ms = 0;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* no hook runs after a reload: the launcher warns for it */
			settings_check_retention_rule(WARNING);
		}

		pgstat_report_activity(STATE_RUNNING, "visiting databases");
		databases = list_databases();
		foreach(lc, databases)
		{
			long		owed;

			if (visit_database(lfirst_oid(lc)) &&
				stats_purge_backlog(lfirst_oid(lc), &owed))
			{
				backlog = true;
				owed_ms = Max(owed_ms, owed);
			}
			CHECK_FOR_INTERRUPTS();
		}
		list_free(databases);
		pgstat_report_activity(STATE_IDLE, NULL);

		/* a backlog is purged at once, after the pause its purge owes */
		if (!backlog)
			sleep_interval(idem_purge_interval);
		else if (owed_ms > 0)
			sleep_interval(Min(owed_ms, (long) idem_purge_interval));
	}
}

/*
 * Pace the purge: after each batch, pause until the visit has paused
 * idem.purge_pause times as long as its batches took, as autovacuum's cost
 * delay paces a vacuum, so that a backlog of millions of expired records is
 * worked off beside the traffic instead of taking a core from it for
 * minutes.  A pause ends at the visit's deadline, so that a visit stays
 * short (DROP DATABASE waits for it); what it still owes then is left to
 * the launcher, which waits that long before it visits again
 * (purge_owed_ms).  The pause shows as wait event IdemPurgePause (from 17
 * on; "Extension" before), and a SIGTERM ends it at once.
 */
static int64 purge_work_us = 0; /* this visit's batches */
static int64 purge_paused_us = 0;	/* this visit's pauses */

/* The pause this visit owes, in microseconds */
static int64
purge_owed_us(void)
{
	double		owed = purge_work_us * idem_purge_pause - purge_paused_us;

	return owed <= 0 ? 0 : (int64) Min(owed, (double) INT_MAX * 1000);
}

/* The same in whole milliseconds, as the launcher's stats slot keeps it */
static long
purge_owed_ms(void)
{
	return (long) ((purge_owed_us() + 999) / 1000);
}

static void
purge_pause(TimestampTz started, TimestampTz deadline)
{
	static uint32 pause_event = 0;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz end;
	TimestampTz woke;

	/* microseconds, not TimestampDifferenceMilliseconds's rounded-up ms */
	purge_work_us += now - started;
	end = Min(now + purge_owed_us(), deadline);
	if (pause_event == 0)
		pause_event = idem_wait_event("IdemPurgePause");
	/* a latch set for another reason (a catch-up signal) ends no pause */
	while (now < end)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 TimestampDifferenceMilliseconds(now, end),
						 pause_event);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		woke = GetCurrentTimestamp();
		purge_paused_us += woke - now;
		now = woke;
	}
}

/*
 * Purge what other describes, one transaction per batch, until a batch is
 * not full or the deadline passes; whether more may be left
 */
static bool
purge_in_batches(const PurgeOther *other, TimestampTz deadline, uint64 *total)
{
	for (;;)
	{
		bool		more = false;
		TimestampTz started = GetCurrentTimestamp();

		CHECK_FOR_INTERRUPTS();
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, other->activity);
		*total += other->batch(purge_cutoff(GetCurrentStatementStartTimestamp()),
							   idem_purge_batch, &more);
		PopActiveSnapshot();
		CommitTransactionCommand();
		if (!more)
			return false;
		purge_pause(started, deadline);
		if (GetCurrentTimestamp() >= deadline)
			return true;
	}
}

void
idem_purge_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	TimestampTz start;
	TimestampTz deadline;
	uint64		total = 0;
	bool		more = false;
	bool		installed;
	bool		subscribed;
	bool		distributed;
	List	   *targets;
	ListCell   *lc;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	/*
	 * Deleting expired records needs no durability: every function already
	 * treats them as absent, and a purge lost in a crash is done again.  So
	 * a purge never waits for a WAL flush or for a synchronous standby.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * Is idem installed here?  If not, there is nothing to do.  Nor is
	 * there on a logical-replication subscriber that receives idem_record:
	 * the publisher purges, and its deletions arrive (subscription.c).
	 * Otherwise, which relations hold this node's records (on Citus, the
	 * shard placements here)?  The list outlives the transaction.
	 */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	installed = OidIsValid(get_extension_oid("idem", true));
	subscribed = false;
	targets = NIL;
	if (installed)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		Oid			subid;

		PushActiveSnapshot(GetTransactionSnapshot());
		subid = subscription_of_records();
		subscribed = OidIsValid(subid);
		if (subscribed)
			ereport(DEBUG1,
					(errmsg_internal("idem purge skips database \"%s\": subscription \"%s\" receives table \"idem_record\"",
									 get_database_name(MyDatabaseId),
									 get_subscription_name(subid, true))));
		else
			targets = purge_targets(&distributed);
		PopActiveSnapshot();
		MemoryContextSwitchTo(old);
	}
	CommitTransactionCommand();
	if (!installed || subscribed)
		proc_exit(0);

	start = GetCurrentTimestamp();
	deadline = TimestampTzPlusMilliseconds(start, IDEM_PURGE_VISIT_MS);
	foreach(lc, targets)
	{
		IdemPurgeScan scan = {.from = DT_NOBEGIN};

		do
		{
			TimestampTz started = GetCurrentTimestamp();

			CHECK_FOR_INTERRUPTS();

			/*
			 * One transaction per batch, so that the rows a batch deletes
			 * are gone, and its locks released, as soon as it is done.  The
			 * statement start time is the transaction's start time too; the
			 * snapshot is what the batch's statements see.
			 */
			SetCurrentStatementStartTimestamp();
			StartTransactionCommand();
			PushActiveSnapshot(GetTransactionSnapshot());
			pgstat_report_activity(STATE_RUNNING, "purging expired records");

			total += purge_batch(lfirst_oid(lc),
								 purge_cutoff(GetCurrentStatementStartTimestamp()),
								 &scan, &more);

			PopActiveSnapshot();
			CommitTransactionCommand();
			if (more)
				purge_pause(started, deadline);
		} while (more && GetCurrentTimestamp() < deadline);

		/* out of time with expired records left: the launcher comes back */
		if (more)
			break;
	}

	/* then the others, one transaction per batch too */
	for (int i = 0; i < (int) lengthof(purge_others) && !more; i++)
		more = purge_in_batches(&purge_others[i], deadline, &total);

	stats_count_purge(total, start, GetCurrentTimestamp(), more,
					  more ? purge_owed_ms() : 0);
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}
