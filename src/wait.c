/*-------------------------------------------------------------------------
 *
 * wait.c
 *	  Waking the claims that wait for a committed pending claim to finish.
 *
 * A claim with wait => true that finds a committed pending claim of its key
 * within its lease waits until that claim is completed, failed, released or
 * forgotten, or its lease runs out, or the claim's own wait_timeout passes.
 * Waiting for a transaction (record.c's probe) cannot serve: the first
 * attempt's transaction has committed and holds nothing.
 *
 * With idem preloaded, shared memory holds a small fixed array of wake-up
 * slots, each a generation counter and a condition variable; a key maps to
 * one slot by its hash.  A transaction that finished a key remembers the
 * key's slot, and once it has committed (or prepared: a claim then waits
 * for the prepared transaction itself) bumps the slot's generation and
 * broadcasts on its condition variable.  Not earlier: before the commit, a
 * woken claim could not see the change.  A waiter reads the generation
 * before it looks at the record, and sleeps only while the generation is
 * the one it read, so a wake-up between its look and its sleep is not lost.
 * Keys that share a slot only wake each other needlessly: a woken claim
 * looks at its record again, and sleeps again if nothing changed.
 *
 * Without preloading there is no shared memory to sleep on: a waiting
 * claim polls, sleeping 10 ms at first and twice as long after each look,
 * up to one second, never past its deadline.
 *
 * Either way the sleep is on the process latch, so a cancel, a
 * statement_timeout or a server shutdown ends it at once.
 *
 * The wait is not a lock wait: the claim's owner committed and holds
 * nothing that a waiter could queue for, so the lock manager neither times
 * it out nor sees it in a deadlock.  A waiter can hold a lock that the
 * owner needs in order to finish the claim (a row that the owner's
 * finishing transaction updates): the owner then waits for the waiter,
 * which waits for the owner, and no deadlock detector can see the cycle.
 * So the waiter does what the detector would: once it has slept
 * deadlock_timeout, and again after each further deadlock_timeout, it
 * looks whether any other process waits for a lock that its transaction
 * holds, and if one does, it fails with the error of a deadlock (40P01),
 * naming that process, and its transaction lets its locks go.  Which
 * process would finish the claim cannot be known (any session may), so a
 * waiter that holds up another transaction's lock wait gives up even when
 * that transaction is not the owner: a waiter never holds others up for
 * longer than deadlock_timeout, and a cycle of any length through it is
 * broken.  lock_timeout bounds the wait as it bounds a lock wait, counted
 * from the claim's first sleep, and ends it with the error that a lock wait
 * gets (55P03).  Nothing else bounds it but the lease, wait_timeout and
 * statement_timeout.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "keylock.h"
#include "wait.h"

/* How many wake-up slots: keys beyond it share them */
#define IDEM_WAIT_SLOTS			128

/* The polling sleeps without preloading, in milliseconds */
#define IDEM_POLL_FIRST_MS		10
#define IDEM_POLL_MAX_MS		1000

typedef struct IdemWakeSlot
{
	pg_atomic_uint64 generation;	/* bumped by every wake-up */
	ConditionVariable cv;
} IdemWakeSlot;

static IdemWakeSlot *slots = NULL;

/* The slots this transaction finished keys of, to wake at its commit */
static bool to_wake[IDEM_WAIT_SLOTS];
static bool any_to_wake = false;
static bool callback_registered = false;

/* Called from idem.c's shmem_request_hook */
void
wait_shmem_request(void)
{
	RequestAddinShmemSpace(sizeof(IdemWakeSlot) * IDEM_WAIT_SLOTS);
}

/* Called from idem.c's shmem_startup_hook */
void
wait_shmem_startup(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	slots = ShmemInitStruct("idem wait", sizeof(IdemWakeSlot) * IDEM_WAIT_SLOTS,
							&found);
	if (!found)
	{
		for (int i = 0; i < IDEM_WAIT_SLOTS; i++)
		{
			pg_atomic_init_u64(&slots[i].generation, 0);
			ConditionVariableInit(&slots[i].cv);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* The wait event of a claim that waits: IdemClaimWait (17+) */
static uint32
claim_wait_event(void)
{
	static uint32 event = 0;

	if (event == 0)
		event = idem_wait_event("IdemClaimWait");
	return event;
}

static IdemWakeSlot *
slot_of(const IdemKey *key)
{
	return &slots[keylock_hash(key) % IDEM_WAIT_SLOTS];
}

/*
 * At the end of a transaction that finished keys: wake their waiters if it
 * committed (or prepared), forget them either way.
 */
static void
wake_at_commit(XactEvent event, void *arg)
{
	if (!any_to_wake)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
			for (int i = 0; i < IDEM_WAIT_SLOTS; i++)
			{
				if (!to_wake[i])
					continue;
				pg_atomic_fetch_add_u64(&slots[i].generation, 1);
				ConditionVariableBroadcast(&slots[i].cv);
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			break;
		default:
			return;
	}
	memset(to_wake, 0, sizeof(to_wake));
	any_to_wake = false;
}

/*
 * The calling transaction completed, failed, released or forgot the key's
 * pending claim: wake the claims waiting for it once it commits.
 */
void
wait_key_finished(const IdemKey *key)
{
	if (slots == NULL)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(wake_at_commit, NULL);
		callback_registered = true;
	}
	to_wake[slot_of(key) - slots] = true;
	any_to_wake = true;
}

/* Before looking at the key's record: what a later sleep compares with */
void
wait_prepare(const IdemKey *key, IdemWait *w)
{
	if (slots != NULL)
		w->generation = pg_atomic_read_u64(&slot_of(key)->generation);
	else if (w->poll_ms == 0)
		w->poll_ms = IDEM_POLL_FIRST_MS;
}

/* Milliseconds from now until a timestamp, rounded up; 0 if it has passed */
static long
ms_until(TimestampTz until)
{
	TimestampTz now = GetCurrentTimestamp();

	if (until <= now)
		return 0;
	return (long) Min((until - now + 999) / 1000, (TimestampTz) LONG_MAX);
}

/*
 * The pid of a process that waits for a lock this backend holds, 0 if
 * none.  Read from a copy of the lock table (GetLockStatusData), as
 * pg_locks is: once per deadlock_timeout of a claim's wait.  A wait for
 * this backend's virtual transaction is left out: CREATE INDEX
 * CONCURRENTLY and its kin wait so for every older transaction, not for a
 * lock the work holds.
 */
static int
blocked_by_me(void)
{
	LockData   *locks = GetLockStatusData();
	int			blocked = 0;

	for (int i = 0; i < locks->nelements && blocked == 0; i++)
	{
		LockInstanceData *mine = &locks->locks[i];

		if (mine->pid != MyProcPid || mine->holdMask == 0)
			continue;
		for (int j = 0; j < locks->nelements && blocked == 0; j++)
		{
			LockInstanceData *other = &locks->locks[j];

			if (other->pid == MyProcPid || other->leaderPid == MyProcPid ||
				other->waitLockMode == NoLock ||
				other->locktag.locktag_type == LOCKTAG_VIRTUALTRANSACTION ||
				memcmp(&other->locktag, &mine->locktag, sizeof(LOCKTAG)) != 0)
				continue;
			for (LOCKMODE m = 1; m <= MaxLockMode; m++)
				if ((mine->holdMask & LOCKBIT_ON(m)) &&
					DoLockModesConflict(m, other->waitLockMode))
					blocked = other->pid;
		}
	}
	pfree(locks->locks);
	pfree(locks);
	return blocked;
}

pg_noreturn static void report_wait_error(const IdemKey *key, int blocked);

/*
 * End a claim's wait with the error of the lock wait it stands in for: a
 * deadlock when process blocked waits for this transaction, else the lock
 * timeout
 */
static void
report_wait_error(const IdemKey *key, int blocked)
{
	char	   *k = text_to_cstring(key->key);
	char	   *endpoint = text_to_cstring(key->endpoint);
	char	   *tenant = text_to_cstring(key->tenant);

	if (blocked != 0)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_DEADLOCK_DETECTED),
				 errmsg("deadlock detected"),
				 errdetail("Process %d waits for the committed pending claim of idem key \"%s\" of endpoint \"%s\" (tenant \"%s\") to be finished; process %d waits for a lock that process %d holds.",
						   MyProcPid, k, endpoint, tenant, blocked, MyProcPid),
				 errhint("The claim's owner may need that lock to finish it. Take a claim's wait before the locks of the work it guards, or wait without holding locks.")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("canceling statement due to lock timeout"),
			 errdetail("The committed pending claim of idem key \"%s\" of endpoint \"%s\" (tenant \"%s\") was not finished within lock_timeout.",
					   k, endpoint, tenant)));
}

/*
 * Sleep until the key's slot is woken after wait_prepare looked, or until
 * "until" passes; without preloading, for one poll's sleep.  The caller
 * then looks at the record again, whatever woke it.  Not past lock_timeout
 * from the first sleep: a sleep called after that raises its error; nor
 * past the next deadlock check, which raises a deadlock's error when
 * another process waits for a lock this transaction holds (see the file's
 * header).
 */
void
wait_sleep(const IdemKey *key, TimestampTz until, IdemWait *w)
{
	long		ms;
	TimestampTz now = GetCurrentTimestamp();

	if (!w->slept)
	{
		w->slept = true;
		w->lock_deadline = LockTimeout > 0 ?
			TimestampTzPlusMilliseconds(now, LockTimeout) : DT_NOEND;
		w->deadlock_check = TimestampTzPlusMilliseconds(now, DeadlockTimeout);
	}
	if (now >= w->deadlock_check)
	{
		int			blocked = blocked_by_me();

		if (blocked != 0)
			report_wait_error(key, blocked);
		w->deadlock_check = TimestampTzPlusMilliseconds(now, DeadlockTimeout);
	}
	if (now >= w->lock_deadline)
		report_wait_error(key, 0);
	until = Min(Min(until, w->lock_deadline), w->deadlock_check);

	if (slots != NULL)
	{
		IdemWakeSlot *slot = slot_of(key);

		ConditionVariablePrepareToSleep(&slot->cv);
		while (pg_atomic_read_u64(&slot->generation) == w->generation &&
			   (ms = ms_until(until)) > 0)
			(void) ConditionVariableTimedSleep(&slot->cv, ms, claim_wait_event());
		ConditionVariableCancelSleep();
		return;
	}

	ms = Min(ms_until(until), w->poll_ms);
	if (ms > 0)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 ms, claim_wait_event());
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
	w->poll_ms = Min(w->poll_ms * 2, IDEM_POLL_MAX_MS);
}
