/*-------------------------------------------------------------------------
 *
 * keylock.c
 *	  A transaction-scoped lock per (tenant, endpoint, key).
 *
 * Used only on the SQL way into idem_record (record_sql.c: a table that
 * Citus distributes).  There the unique index decides who owns a key, but
 * SQL can only learn that another transaction is inserting the key by
 * waiting for it.  A claim must answer in_progress at once instead, so on
 * that way every transaction that writes a key's record first takes this
 * lock, and keeps it until it ends.  A claim that cannot have it without
 * waiting knows that another transaction is deciding or holding that key.
 * (A local table needs no such lock: record.c sees the other transaction
 * with a dirty snapshot.)
 *
 * The lock is an advisory lock in the lock manager, so it shows in
 * pg_locks, takes part in deadlock detection, obeys lock_timeout and is
 * released at commit or abort.  Its tag is the database and a 64-bit hash of
 * the key; the fourth field, which core sets to 1 or 2 for the SQL-level
 * advisory lock functions, is IDEM_LOCK_CLASS, so that an application's own
 * advisory locks never collide with idem's.  Two keys that share a hash
 * only make each other answer in_progress (or wait) while both are being
 * written, never break the unique index's guarantee.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"

#include "keylock.h"

/* locktag_field4 of idem's key locks, as shown in pg_locks.objsubid */
#define IDEM_LOCK_CLASS		0x1de4

/* A 64-bit hash of a key, also what wait.c picks a key's wake-up slot by */
uint64
keylock_hash(const IdemKey *key)
{
	const text *parts[3] = {key->tenant, key->endpoint, key->key};
	uint64		hash = 0;

	for (int i = 0; i < 3; i++)
		hash = hash_bytes_extended((const unsigned char *) VARDATA_ANY(parts[i]),
								   VARSIZE_ANY_EXHDR(parts[i]), hash + i);
	return hash;
}

static void
keylock_tag(const IdemKey *key, LOCKTAG *tag)
{
	uint64		hash = keylock_hash(key);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId,
						 (uint32) (hash >> 32), (uint32) hash,
						 IDEM_LOCK_CLASS);
}

/*
 * Take the key's lock until the end of the transaction.  Without wait,
 * returns false at once if another transaction holds it.  With wait, blocks
 * until it is free, bounded by lock_timeout and the deadlock detector.
 * *already_held (if not NULL) tells whether this transaction held it before:
 * then it wrote the key's record itself, and nobody else can finish it.
 */
bool
keylock_acquire(const IdemKey *key, bool wait, bool *already_held)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	keylock_tag(key, &tag);
	res = LockAcquire(&tag, ExclusiveLock, false, !wait);
	if (already_held != NULL)
		*already_held = res == LOCKACQUIRE_ALREADY_HELD ||
			res == LOCKACQUIRE_ALREADY_CLEAR;
	return res != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Whether another transaction holds the key's lock, asked without taking
 * it: idem_replay answers in_progress for such a key, as a claim would, and
 * must not itself make a concurrent claim answer in_progress by holding the
 * lock, even for a moment.  The answer may be stale as soon as it is given,
 * as any claim's answer may.
 */
bool
keylock_held_by_other(const IdemKey *key)
{
	LOCKTAG		tag;
	int			holders;

	keylock_tag(key, &tag);
	(void) GetLockConflicts(&tag, ExclusiveLock, &holders);
	return holders > 0;
}

/*
 * Give back one hold of the key's lock before the end of the transaction:
 * used by a claim that ended up writing nothing.  A hold this transaction
 * took earlier (it claimed the key before) stays.
 */
void
keylock_release(const IdemKey *key)
{
	LOCKTAG		tag;

	keylock_tag(key, &tag);
	LockRelease(&tag, ExclusiveLock, false);
}
