/*-------------------------------------------------------------------------
 *
 * record.c
 *	  The record room's interface (record.h), the direct way into a local
 *	  idem_record, and the facts about idem_record that both ways share.
 *
 * The interface.  record_open() returns the access handle that every call
 * takes; the way the table is reached (this file's direct_methods, or
 * record_sql.c's sql_methods for a table that Citus distributes) is picked
 * when the bracket opens, from what this backend knows of the table, and
 * every call goes through the handle's methods.  A write acts on the
 * version of the record that a probe read, passed to it as an argument:
 * no call depends on what an earlier one left behind, and a batch's handle
 * (record_batch_open) is only a bracket kept open across many calls.
 * Between record_open() and record_close() idem runs as the table's owner
 * (direct access checks no privileges; the SQL way's statements need
 * them), the way core's foreign key triggers switch to a table's owner: an
 * error in between restores the caller's user with the (sub)transaction's
 * abort, and the handle's memory goes with the caller's context.
 *
 * The direct way reads and writes the table the way core's logical
 * replication apply and INSERT ... ON CONFLICT do: no SPI, no plan, no
 * per-key heavyweight lock.  The table, its unique key index and the
 * fencing floor are opened by OIDs cached per backend and looked up again
 * after a relcache invalidation of either table.
 *
 * - A read (a replay, or a claim's first look) scans the unique index with
 *   the active snapshot; under READ COMMITTED a claim's first look is the
 *   probe instead, when it finds the key settled
 *   (record_probe_shows_snapshot).
 * - A probe scans it with a dirty snapshot, which shows a version that
 *   another transaction is inserting, updating or deleting: a claim then
 *   answers in_progress at once, or with wait waits as core's conflict
 *   loop does (check_exclusion_or_unique_constraint): for a speculative
 *   insertion in progress, until it is done (SpeculativeInsertionWait),
 *   else for the transaction (XactLockTableWait, with the reason of the
 *   caller's intent for its context line: lock_timeout, the deadlock
 *   detector and cancel apply, and a prepared transaction is waited for
 *   until it is finished), and then looks again.  A version being deleted
 *   (a purge of an expired record, idem_forget, a DELETE by hand) is no
 *   exception: the deleter may be waiting itself (the floor's trigger, for
 *   an operator's open transaction) for as long as that transaction lasts,
 *   and a claim without wait never waits for an unrelated transaction.
 *   Whether the deleter commits or aborts, a claim that answered
 *   in_progress executed nothing and gave out no attempt.  Under
 *   REPEATABLE READ and SERIALIZABLE the probe also asks the table access
 *   method whether the transaction's snapshot shows the version found
 *   (table_tuple_satisfies_snapshot), as ExecCheckTupleVisible does, so
 *   that the protocol never acts on a record its snapshot cannot see.
 *   idem_replay never waits; it answers from its snapshot.
 * - A fresh claim inserts speculatively, as INSERT ... ON CONFLICT does
 *   (access_insert_speculative), with every unique index on the key
 *   columns as arbiter; if a concurrent insert of the same key won, the
 *   heap tuple is killed and the protocol probes again.  Two claims can
 *   therefore never both insert a key
 *   (test/isolation/specs/claim-specconflict.spec holds both claims
 *   between their probe and their insertion).  The arbiters include the
 *   indexes that REINDEX CONCURRENTLY builds and retires (access_arbiters),
 *   which check uniqueness too; the probe needs only idem_record_key, which
 *   has an entry for every live version.
 * - A re-claim and a finish lock the probed version (access_lock_row: it
 *   must still be the newest, else the protocol probes again) and update
 *   it.  A finish changes no indexed column, so it is a HOT update when the
 *   page has room.  If another transaction holds the row's lock, a caller
 *   that waits waits for it, and then probes and decides again, as of after
 *   the wait.  A version that the same command changed already is an
 *   error, as in core's ON CONFLICT DO UPDATE.
 *
 * Nothing here deletes a record: the purge and idem_forget go through SQL
 * (record_sql.c), so the AFTER DELETE trigger raises the fencing floor for
 * every deletion.  Before a purge batch deletes, though, it takes the floor
 * rows of the buckets it deletes from here (record_hold_floor), without
 * waiting, so that its trigger never waits for another transaction.
 *
 * The table's rules.  A heap insert or update applies none of the table's
 * constraints: every row written goes through ExecConstraints first
 * (access_check_row), so a CHECK that a DBA adds is enforced here as on
 * the SQL way, its error naming the constraint and the table.  Row
 * triggers are not fired on this path, and that is a decision: idem_record
 * has none, and a row trigger is a place for user code to run inside every
 * claim (and to change the row idem decides on).  So a table with a
 * trigger on INSERT or UPDATE (or a foreign key, or a deferrable
 * constraint, which are checked by row triggers) is refused where it is
 * looked up, naming it (access_refuse_write_triggers), rather than written
 * past it: a rule of the table never holds on one way and not the other.
 * On the SQL way (Citus) the statements fire them.  Triggers on DELETE fire
 * for the SQL that deletes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "access.h"
#include "record_way.h"

/* idem_record's columns, found by name when the table is looked up */
#define RECORD_COLUMNS(X) \
	X(C_TENANT, tenant) X(C_ENDPOINT, endpoint) X(C_KEY, key) \
	X(C_STATE, state) X(C_RETRYABLE, retryable) \
	X(C_FINGERPRINT, fingerprint) X(C_STATUS, status) X(C_BODY, body) \
	X(C_ATTEMPT, attempt) X(C_CREATED_AT, created_at) \
	X(C_CLAIMED_AT, claimed_at) X(C_LEASE_EXPIRES_AT, lease_expires_at) \
	X(C_FINISHED_AT, finished_at) X(C_EXPIRES_AT, expires_at) \
	X(C_HEADERS, headers)

IDEM_NAMED_ENUM(RecordColumn, RECORD_COLUMNS, NUM_COLUMNS, column_names);

/* The names of idem_record.state, indexed by IdemState */
const char *const record_state_names[] = {
	[IDEM_PENDING] = "pending",
	[IDEM_SUCCEEDED] = "succeeded",
	[IDEM_FAILED] = "failed"
};


/* What the look-up of idem_record finds with it (look_up_rest) */
typedef struct RecordTables
{
	bool		distributed;	/* through SQL: record_sql.c */
	Oid			key_index;
	Oid			floor_index;
	AttrNumber	trace;			/* 0.4.0's column, or InvalidAttrNumber */
} RecordTables;

static RecordTables tables;

static void look_up_rest(AccessTable *t, Oid schema);

/* The indexes the direct way reads, as the install script makes them */
static const AccessIndex key_index =
{"idem_record_key", true, {"tenant", "endpoint", "key"}};
static const AccessIndex floor_index =
{"idem_attempt_floor_pkey", true, {"bucket"}};

static AccessTable record_table =
	ACCESS_TABLE("idem_record", column_names, look_up_rest);

static const RecordMethods direct_methods;

/*
 * Find, with idem_record, the fencing floor and the indexes, and decide
 * which way the table is reached.  Refuses a table that is not stored by
 * the heap access method: the direct path reads heap tuples.  An
 * invalidation of the fencing floor invalidates the look-up too.
 */
static void
look_up_rest(AccessTable *t, Oid schema)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	tables.distributed = sql_distributed(t->relid);
	SPI_finish();
	if (!tables.distributed)
	{
		access_require_heap(t->relid);
		access_refuse_write_triggers(t->relid);
	}
	t->other = access_table("idem_attempt_floor", schema);
	tables.trace = access_optional_column(t->relid, "trace", TEXTOID);
	tables.key_index = access_index_of(&key_index, schema, t->relid);
	tables.floor_index = access_index_of(&floor_index, schema, t->other);
}

/*
 * idem_record's OID, for the callers that need to know about the table
 * itself (subscription.c): looked up like every bracket's tables.
 */
Oid
record_relation(void)
{
	return access_relation(&record_table);
}

/* ---- The interface: brackets, and dispatch to the way ---- */

/*
 * Open a bracket of calls, as the table's owner; values read are copied
 * into the memory context current now.  Inside a batch on the direct way
 * (batch not NULL), the batch's bracket is taken over instead: only the
 * context that values go to changes, and the executor state's per-tuple
 * memory is reset, so a batch of any length runs in bounded memory.  The
 * SQL way keeps nothing worth sharing across calls (its plans are kept
 * per backend anyway): there a batch is a loop of ordinary brackets.
 */
RecordAccess *
record_open(RecordAccess *batch)
{
	RecordAccess *ra;
	Oid			userid;
	int			sec_context;

	if (batch != NULL && batch->methods == &direct_methods)
	{
		batch->caller = CurrentMemoryContext;
		if (batch->estate != NULL)
			ResetPerTupleExprContext(batch->estate);
		return batch;
	}
	(void) access_relation(&record_table);
	ra = palloc0(sizeof(RecordAccess));
	ra->methods = tables.distributed ? &sql_methods : &direct_methods;
	ra->caller = CurrentMemoryContext;
	ra->bracket = CurrentMemoryContext;
	GetUserIdAndSecContext(&userid, &sec_context);
	ra->caller_userid = userid;
	ra->caller_sec_context = sec_context;
	SetUserIdAndSecContext(record_table.owner,
						   sec_context | SECURITY_LOCAL_USERID_CHANGE);
	ra->methods->open(ra);
	return ra;
}

void
record_close(RecordAccess *ra)
{
	if (ra->batch)
		return;
	ra->methods->close(ra);
	SetUserIdAndSecContext(ra->caller_userid, ra->caller_sec_context);
	pfree(ra);
}

/*
 * Open a batch: one bracket for all the calls of a batch function, up to
 * record_batch_close(), each of which passes it to record_open().  An error
 * in between needs no clean-up here: the (sub)transaction's abort closes
 * the relations, drops the slot's pin and restores the caller's user, and
 * the handle is memory of the batch function's context.
 */
RecordAccess *
record_batch_open(void)
{
	RecordAccess *batch;

	(void) access_relation(&record_table);
	if (tables.distributed)
	{
		batch = palloc0(sizeof(RecordAccess));
		batch->methods = &sql_methods;
		return batch;
	}
	batch = record_open(NULL);
	batch->batch = true;
	return batch;
}

void
record_batch_close(RecordAccess *batch)
{
	if (batch->methods != &direct_methods)
	{
		pfree(batch);
		return;
	}
	batch->batch = false;
	batch->caller = batch->bracket;
	record_close(batch);
}

/*
 * Take the locks that a write of the bracket will take, before the caller
 * reads the clock for it: a claim dates its record after every wait, and
 * RowExclusiveLock on idem_record waits for a CREATE INDEX or REINDEX that
 * holds ShareLock (and the floor's lock for DDL on the floor).  A replay
 * never calls this, so it goes on answering meanwhile.
 */
void
record_prepare_write(RecordAccess *ra)
{
	LockRelationOid(record_table.relid, RowExclusiveLock);
	LockRelationOid(record_table.other, AccessShareLock);
	ra->methods->prepare_write(ra);
}

/*
 * Read the key's record as the active snapshot shows it into rec; false if
 * there is none.  A read-only look-up: no new snapshot, nothing written.
 */
bool
record_fetch(RecordAccess *ra, const IdemKey *key, IdemRecord *rec)
{
	return ra->methods->fetch(ra, key, rec);
}

/*
 * Whether a probe that finds the key settled (RECORD_ABSENT, or
 * RECORD_FOUND) may stand in for record_fetch: on the direct way under
 * READ COMMITTED.  There the probe's version is the newest committed one
 * (or this transaction's own), and a statement may act on that, as
 * INSERT ... ON CONFLICT does: a version that committed after the
 * statement's snapshot was taken is only newer than the one the snapshot
 * shows.  Under REPEATABLE READ and SERIALIZABLE the transaction's
 * snapshot must be read (check_version compares the two), and the SQL
 * way's probe takes the key's lock, which a replay must not.
 */
bool
record_probe_shows_snapshot(RecordAccess *ra)
{
	return ra->methods == &direct_methods && !IsolationUsesXactSnapshot();
}

/*
 * Whether a claim of a bracket that has written already may insert before
 * it looks at the key (idem_claim_many's guess): where a probe stands for
 * the snapshot, and where the key's arbiters are the table's only unique
 * or exclusion indexes.  Another one (a DBA's) is checked without the
 * arbiters' leniency: an insert of a key that exists would wait on it or
 * fail, where a look would answer.
 */
bool
record_may_insert_first(RecordAccess *ra)
{
	return record_probe_shows_snapshot(ra) && ra->estate != NULL &&
		ra->only_arbiters;
}

/*
 * What another transaction leaves of the key's record: RECORD_ABSENT,
 * RECORD_BUSY while another transaction writes it (with wait: until it
 * ends), or RECORD_FOUND with the newest version in rec, rec->visible
 * telling (under REPEATABLE READ and SERIALIZABLE; true otherwise) whether
 * the transaction's snapshot shows it; *own (if not NULL) tells whether
 * this transaction wrote that version.  With the SQL way, the key's lock
 * is taken too; record_unlock gives it back.
 */
RecordProbe
record_probe(RecordAccess *ra, const IdemKey *key, bool wait,
			 RecordIntent intent, IdemRecord *rec, bool *own)
{
	bool		own_version = false;
	RecordProbe result;

	result = ra->methods->probe(ra, key, wait, intent, rec, &own_version);
	if (own != NULL)
		*own = own_version;
	return result;
}

/*
 * Whether another transaction is inserting or updating the key's record,
 * asked without waiting and without locking anything (idem_replay).  A
 * record being deleted is not busy: the caller's snapshot decides.
 */
bool
record_busy(RecordAccess *ra, const IdemKey *key)
{
	return ra->methods->busy(ra, key);
}

/* Give back what record_probe took when nothing was written */
void
record_unlock(RecordAccess *ra, const IdemKey *key)
{
	ra->methods->unlock(ra, key);
}

/*
 * Insert a fresh pending claim; false if a concurrent transaction inserted
 * the key first (the caller probes again).  *attempt is the new claim's
 * attempt: one more than the fencing floor of the key's bucket.
 */
bool
record_insert_claim(RecordAccess *ra, const IdemKey *key,
					const IdemFingerprint *fp, TimestampTz now,
					TimestampTz lease_expires_at, TimestampTz expires_at,
					const char *trace, int32 *attempt)
{
	return ra->methods->insert_claim(ra, key, fp, now, lease_expires_at,
									 expires_at, trace, attempt);
}

/*
 * Replace the key's record, the version probed, with next: a pending claim
 * again (claimed now) or a finished record (finished now).
 * RECORD_CHANGED if another transaction changed it since, or if the write
 * had to wait for one that held it; RECORD_WRITE_BUSY if one holds it and
 * wait is false.
 */
RecordWrite
record_write(RecordAccess *ra, const IdemKey *key, const IdemRecord *probed,
			 const IdemRecord *next, TimestampTz now, bool wait)
{
	return ra->methods->write(ra, key, probed, next, now, wait);
}

/*
 * Delete the key's record, whatever its state; false if it had none.
 * Waits first for a transaction that is writing it.
 */
bool
record_forget(RecordAccess *ra, const IdemKey *key)
{
	return ra->methods->forget(ra, key);
}

/*
 * The purge and the listing go through SQL on every table: they are not on
 * a request's path, and a deletion must fire the trigger that raises the
 * fencing floor.  On the direct way, the first of them opens a bracket of
 * SQL inside the direct one (sql_enter), which closes with it.
 *
 * The relations the purge on this node goes through: the local
 * idem_record, or the shard placements of a distributed one that this node
 * holds (sql_purge_targets).
 */
List *
record_purge_targets(RecordAccess *ra, bool *distributed)
{
	return sql_purge_targets(ra, distributed);
}

uint64
record_purge_batch(RecordAccess *ra, Oid target, TimestampTz now, int batch,
				   IdemPurgeScan *scan, bool *more)
{
	return sql_purge_batch(ra, target, now, batch, scan, more);
}

List *
record_list(RecordAccess *ra, text *tenant, text *endpoint, bool with_body,
			int32 max_rows, TupleDesc desc)
{
	return sql_list(ra, tenant, endpoint, with_body, max_rows, desc);
}

List *
record_suspects(RecordAccess *ra, TimestampTz from, Interval *within,
				text *tenant, TimestampTz now, TupleDesc desc)
{
	return sql_suspects(ra, from, within, tenant, now, desc);
}

/* ---- The facts both ways share ---- */

/* The state named name, as stored in idem_record.state */
IdemState
record_state_of(const char *name)
{
	for (int s = IDEM_PENDING; s <= IDEM_FAILED; s++)
		if (strcmp(name, record_state_names[s]) == 0)
			return (IdemState) s;
	elog(ERROR, "idem_record has an unknown state \"%s\"", name);
	pg_unreachable();
}

/* A fingerprint as idem_record.fingerprint stores it */
Datum
record_fingerprint_datum(const IdemFingerprint *fp)
{
	bytea	   *b = (bytea *) palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	SET_VARSIZE(b, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(b), fp->digest, IDEM_FINGERPRINT_LEN);
	return PointerGetDatum(b);
}

/* The stored fingerprint, read back */
void
record_read_fingerprint(Datum stored, IdemFingerprint *fp)
{
	bytea	   *b = DatumGetByteaPP(stored);

	if (VARSIZE_ANY_EXHDR(b) != IDEM_FINGERPRINT_LEN)
		elog(ERROR, "idem_record has a fingerprint of %d bytes",
			 (int) VARSIZE_ANY_EXHDR(b));
	fp->present = true;
	memcpy(fp->digest, VARDATA_ANY(b), IDEM_FINGERPRINT_LEN);
}

/*
 * The key's bucket of idem_attempt_floor: hashtext(key) & 4095, as the
 * trigger and the SQL way's statements compute it
 */
static int32
floor_bucket(const IdemKey *key)
{
	return DatumGetInt32(DirectFunctionCall1Coll(hashtext, C_COLLATION_OID,
												 PointerGetDatum(key->key)))
		& (IDEM_FLOOR_BUCKETS - 1);
}

/*
 * The fencing floor of the key's bucket (0 if none).  With exact, as the
 * newest committed state shows it (a snapshot of its own).  Without, a
 * first estimate that costs no snapshot: the highest version of the
 * bucket's row that a dirty snapshot shows, which counts a raise another
 * transaction is making (if it rolls back, an attempt was only numbered
 * higher than it had to be; attempts only have to grow), but can miss a
 * version that a non-HOT update of the row gave an index entry while the
 * scan ran.  So only the read that decides is exact.
 *
 * The floor, its index and a slot stay open from a bracket's first read
 * to its close: a batch's claims (idem_claim_many) open them once.
 */
static int32
attempt_floor(RecordAccess *ra, int32 bucket, bool exact)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	SnapshotData dirty;
	Snapshot	snapshot;
	int32		result = 0;

	if (ra->floor == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(ra->bracket);

		ra->floor = access_open(&record_table, true, AccessShareLock);
		ra->floor_index = index_open(tables.floor_index, AccessShareLock);
		ra->floor_slot = table_slot_create(ra->floor, NULL);
		MemoryContextSwitchTo(old);
	}
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(bucket));
	InitDirtySnapshot(dirty);
	snapshot = exact ? RegisterSnapshot(GetLatestSnapshot()) : &dirty;
	scan = idem_index_beginscan(ra->floor, ra->floor_index, snapshot, 1);
	index_rescan(scan, &skey, 1, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, ra->floor_slot))
	{
		bool		isnull;

		result = Max(result,
					 DatumGetInt32(slot_getattr(ra->floor_slot, 2, &isnull)));
	}
	index_endscan(scan);
	if (exact)
		UnregisterSnapshot(snapshot);
	return result;
}

/*
 * Take the fencing floor's rows of the n distinct buckets (ascending) that
 * a purge batch is about to delete records of, without waiting for any
 * other transaction: held[i] tells whether this transaction now holds
 * buckets[i], having locked its row (as the trigger's ON CONFLICT DO
 * UPDATE locks it) or inserted it.  The AFTER DELETE trigger, which raises
 * the floor of every bucket the batch deletes records of, then finds each
 * row it updates already this transaction's, and never waits.
 *
 * A bucket whose row another transaction is inserting, updating or
 * deleting, or has locked, is not held: that transaction (an operator's
 * idem_forget left open, a DELETE by hand, another purge) may keep it for
 * as long as it lasts, and the purge leaves the bucket's records for later
 * rather than wait with a batch of deletions made and uncommitted, which
 * would keep every record of the batch "being deleted" meanwhile.
 *
 * The row is looked up with a dirty snapshot, which shows another
 * transaction's insertion or change; one that another transaction merely
 * locked is found by the lock itself (LockWaitSkip).  A bucket that has no
 * row yet gets one with attempt 1, inserted speculatively: if another
 * transaction inserted the bucket's row first, ours is killed and the
 * bucket is not held.  The trigger then raises the row to the highest
 * attempt deleted; if no record of the bucket gets deleted after all (a
 * claim took them over meanwhile), the floor stays at 1, which only makes a
 * new key of that bucket start at attempt 2: attempts only have to grow.
 */
void
record_hold_floor(const int32 *buckets, int n, bool *held)
{
	Relation	floor;
	Relation	index;
	TupleTableSlot *slot;
	EState	   *estate = NULL;
	ResultRelInfo *rri = NULL;
	SnapshotData dirty;

	floor = access_open(&record_table, true, RowExclusiveLock);
	index = index_open(tables.floor_index, RowExclusiveLock);
	slot = table_slot_create(floor, NULL);
	InitDirtySnapshot(dirty);
	for (int i = 0; i < n; i++)
	{
		ScanKeyData skey;

		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(buckets[i]));
		for (;;)
		{
			IndexScanDesc scan;
			bool		found;
			ItemPointerData tid;
			TM_Result	result;

			scan = idem_index_beginscan(floor, index, &dirty, 1);
			index_rescan(scan, &skey, 1, NULL, 0);
			found = index_getnext_slot(scan, ForwardScanDirection, slot);
			index_endscan(scan);
			if (!found)
			{
				if (estate == NULL)
				{
					estate = CreateExecutorState();
					rri = makeNode(ResultRelInfo);
					InitResultRelInfo(rri, floor, 0, NULL, 0);
					ExecOpenIndices(rri, true);
				}
				ExecClearTuple(slot);
				slot->tts_values[0] = Int32GetDatum(buckets[i]);
				slot->tts_values[1] = Int32GetDatum(1);
				slot->tts_isnull[0] = slot->tts_isnull[1] = false;
				ExecStoreVirtualTuple(slot);
				held[i] = access_insert_speculative(rri, estate, slot,
													list_make1_oid(tables.floor_index));
				break;
			}
			if (TransactionIdIsValid(dirty.xmin) ||
				TransactionIdIsValid(dirty.xmax))
			{
				held[i] = false;	/* another transaction is writing it */
				break;
			}
			tid = slot->tts_tid;
			result = access_lock_row(floor, &tid, GetLatestSnapshot(), slot,
									 LockWaitSkip, false,
									 "a row of idem_attempt_floor");
			if (result == TM_Ok || result == TM_WouldBlock)
			{
				held[i] = result == TM_Ok;
				break;
			}
			/* changed and committed since the look-up: look again */
		}
	}
	if (estate != NULL)
	{
		ExecCloseIndices(rri);
		FreeExecutorState(estate);
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(floor, NoLock);
	CommandCounterIncrement();
}

/* ---- The direct way ---- */

static void
direct_open(RecordAccess *ra)
{
	ra->rel = access_open(&record_table, false, AccessShareLock);
	ra->key_index = index_open(tables.key_index, AccessShareLock);
	ra->slot = table_slot_create(ra->rel, NULL);
}

static void
direct_close(RecordAccess *ra)
{
	if (ra->sql_entered)
		sql_close(ra);
	if (ra->estate != NULL)
	{
		ExecCloseIndices(ra->rri);
		FreeExecutorState(ra->estate);
	}
	if (ra->floor != NULL)
	{
		ExecDropSingleTupleTableSlot(ra->floor_slot);
		index_close(ra->floor_index, NoLock);
		table_close(ra->floor, NoLock);
	}
	ExecDropSingleTupleTableSlot(ra->slot);
	index_close(ra->key_index, NoLock);
	table_close(ra->rel, NoLock);
}

/*
 * Set up for writing: RowExclusiveLock on the table and its indexes, and
 * the executor state that maintaining the indexes needs, which lives as
 * long as the bracket (a batch's, across its elements).
 */
static void
direct_prepare_write(RecordAccess *ra)
{
	MemoryContext old;

	if (ra->estate != NULL)
		return;
	LockRelationOid(record_table.relid, RowExclusiveLock);
	old = MemoryContextSwitchTo(ra->bracket);
	ra->estate = CreateExecutorState();
	ra->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(ra->rri, ra->rel, 0, NULL, 0);
	ExecOpenIndices(ra->rri, true);
	ra->arbiters = access_arbiters(ra->rri, &record_table.attnum[C_TENANT], 3);
	ra->only_arbiters = true;
	for (int i = 0; i < ra->rri->ri_NumIndices; i++)
	{
		Form_pg_index index = ra->rri->ri_IndexRelationDescs[i]->rd_index;

		if ((index->indisunique || index->indisexclusion) &&
			!list_member_oid(ra->arbiters, index->indexrelid))
			ra->only_arbiters = false;
	}
	MemoryContextSwitchTo(old);
}

/* The scan keys of a key: equality of the three columns, in "C" */
static void
key_scankeys(const IdemKey *key, ScanKeyData *skeys)
{
	const text *parts[3] = {key->tenant, key->endpoint, key->key};

	for (int i = 0; i < 3; i++)
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(parts[i]));
}

/* Copy the record in the bracket's slot into rec */
static void
deform_record(RecordAccess *ra, IdemRecord *rec)
{
	TupleTableSlot *slot = ra->slot;
	bool		isnull;
	Datum		d;
	MemoryContext old;

#define COLUMN(c) slot_getattr(slot, record_table.attnum[c], &isnull)

	rec->state = record_state_of(TextDatumGetCString(COLUMN(C_STATE)));
	rec->retryable = DatumGetBool(COLUMN(C_RETRYABLE));

	d = COLUMN(C_FINGERPRINT);
	rec->fingerprint.present = false;
	if (!isnull)
		record_read_fingerprint(d, &rec->fingerprint);

	d = COLUMN(C_STATUS);
	rec->has_status = !isnull;
	rec->status = isnull ? 0 : DatumGetInt32(d);

	old = MemoryContextSwitchTo(ra->caller);
	d = COLUMN(C_BODY);
	rec->body = isnull ? NULL : DatumGetByteaPCopy(d);
	d = COLUMN(C_HEADERS);
	rec->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	MemoryContextSwitchTo(old);

	rec->attempt = DatumGetInt32(COLUMN(C_ATTEMPT));
	rec->created_at = DatumGetTimestampTz(COLUMN(C_CREATED_AT));
	rec->lease_expires_at = DatumGetTimestampTz(COLUMN(C_LEASE_EXPIRES_AT));
	rec->expires_at = DatumGetTimestampTz(COLUMN(C_EXPIRES_AT));
	rec->tid = slot->tts_tid;
	rec->visible = true;
#undef COLUMN
}

static bool
direct_fetch(RecordAccess *ra, const IdemKey *key, IdemRecord *rec)
{
	ScanKeyData skeys[3];
	IndexScanDesc scan;
	bool		found;

	key_scankeys(key, skeys);
	scan = idem_index_beginscan(ra->rel, ra->key_index,
								GetActiveSnapshot(), 3);
	index_rescan(scan, skeys, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, ra->slot);
	index_endscan(scan);
	if (found)
		deform_record(ra, rec);
	return found;
}

/* What a probe's wait for another transaction is part of */
static const XLTW_Oper intent_oper[] = {
	[RECORD_FOR_CLAIM] = XLTW_InsertIndexUnique,
	[RECORD_FOR_FINISH] = XLTW_Update,
	[RECORD_FOR_FORGET] = XLTW_Delete
};

/*
 * Look the key up with a dirty snapshot.  Returns RECORD_BUSY (and sets
 * *busy) if another transaction is inserting, updating or deleting the
 * key's record; with wait, it waits instead, as core's conflict loop does,
 * and looks again.  A read_only probe never waits, and a version being
 * deleted does not make the key busy for it.  Otherwise the slot holds the
 * newest version, which this transaction may act on if it still is the
 * newest when it locks it.
 *
 * The first version the scan returns decides: the unique index lets a
 * second one of the key exist only while another transaction is writing
 * it, and then either one shows that transaction.
 */
static RecordProbe
probe(RecordAccess *ra, const IdemKey *key, bool wait, bool read_only,
	  RecordIntent intent, bool *busy)
{
	ScanKeyData skeys[3];
	SnapshotData dirty;

	*busy = false;
	key_scankeys(key, skeys);
	InitDirtySnapshot(dirty);
	for (;;)
	{
		IndexScanDesc scan;
		TransactionId xwait;
		ItemPointerData tid;
		bool		deleting;

		scan = idem_index_beginscan(ra->rel, ra->key_index, &dirty, 3);
		index_rescan(scan, skeys, 3, NULL, 0);
		if (!index_getnext_slot(scan, ForwardScanDirection, ra->slot))
		{
			index_endscan(scan);
			return RECORD_ABSENT;
		}
		index_endscan(scan);
		tid = ra->slot->tts_tid;
		xwait = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
		if (!TransactionIdIsValid(xwait))
			return RECORD_FOUND;

		/* a version that another transaction deleted points to itself */
		if (TransactionIdIsValid(dirty.xmin))
			deleting = false;
		else
		{
			HeapTuple	tuple = ExecFetchSlotHeapTuple(ra->slot, false,
													   NULL);

			deleting = ItemPointerEquals(&tuple->t_self,
										 &tuple->t_data->t_ctid);
		}
		if (read_only)
		{
			*busy = !deleting;
			return RECORD_BUSY;
		}
		*busy = true;
		if (!wait)
			return RECORD_BUSY;
		if (dirty.speculativeToken != 0)
			SpeculativeInsertionWait(dirty.xmin, dirty.speculativeToken);
		else
			XactLockTableWait(xwait, ra->rel, &tid, intent_oper[intent]);
	}
}

static RecordProbe
direct_probe(RecordAccess *ra, const IdemKey *key, bool wait,
			 RecordIntent intent, IdemRecord *rec, bool *own)
{
	RecordProbe result;
	bool		busy;
	HeapTuple	tuple;

	result = probe(ra, key, wait, false, intent, &busy);
	if (result != RECORD_FOUND)
		return result;
	tuple = ExecFetchSlotHeapTuple(ra->slot, false, NULL);
	*own = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
	deform_record(ra, rec);
	/* its own version, as ExecCheckTupleVisible has it, needs no look */
	if (IsolationUsesXactSnapshot() && !*own)
		rec->visible = table_tuple_satisfies_snapshot(ra->rel, ra->slot,
													  GetActiveSnapshot());
	return result;
}

static bool
direct_busy(RecordAccess *ra, const IdemKey *key)
{
	bool		busy;

	(void) probe(ra, key, false, true, RECORD_FOR_CLAIM, &busy);
	return busy;
}

/* The direct way takes no lock that it would have to give back */
static void
direct_unlock(RecordAccess *ra, const IdemKey *key)
{
}

/* Store a value in a row being built */
static inline void
set_column(Datum *values, bool *nulls, RecordColumn c, Datum value,
		   bool isnull)
{
	access_set_column(&record_table, values, nulls, c, value, isnull);
}

/*
 * Store rec's values in a row being built: all but the key, which a record
 * never changes.  A pending record is claimed at now, and has not
 * finished; a finished one finished at now.
 */
static void
set_record(Datum *values, bool *nulls, const IdemRecord *rec, TimestampTz now)
{
	bool		pending = rec->state == IDEM_PENDING;

	set_column(values, nulls, C_STATE,
			   CStringGetTextDatum(record_state_names[rec->state]), false);
	set_column(values, nulls, C_RETRYABLE, BoolGetDatum(rec->retryable),
			   false);
	set_column(values, nulls, C_FINGERPRINT,
			   rec->fingerprint.present ?
			   record_fingerprint_datum(&rec->fingerprint) : (Datum) 0,
			   !rec->fingerprint.present);
	set_column(values, nulls, C_STATUS, Int32GetDatum(rec->status),
			   !rec->has_status);
	set_column(values, nulls, C_BODY, PointerGetDatum(rec->body),
			   rec->body == NULL);
	set_column(values, nulls, C_HEADERS, PointerGetDatum(rec->headers),
			   rec->headers == NULL);
	set_column(values, nulls, C_ATTEMPT, Int32GetDatum(rec->attempt), false);
	set_column(values, nulls, C_CREATED_AT,
			   TimestampTzGetDatum(rec->created_at), false);
	if (pending)
		set_column(values, nulls, C_CLAIMED_AT, TimestampTzGetDatum(now),
				   false);
	set_column(values, nulls, C_LEASE_EXPIRES_AT,
			   TimestampTzGetDatum(rec->lease_expires_at), false);
	set_column(values, nulls, C_FINISHED_AT, TimestampTzGetDatum(now),
			   pending);
	set_column(values, nulls, C_EXPIRES_AT,
			   TimestampTzGetDatum(rec->expires_at), false);
	/* the claim that executes dates the record's trace; a finish keeps it */
	if (pending && tables.trace != InvalidAttrNumber)
	{
		values[tables.trace - 1] = rec->trace != NULL ?
			CStringGetTextDatum(rec->trace) : (Datum) 0;
		nulls[tables.trace - 1] = rec->trace == NULL;
	}
}

/* Replace the version at tid (locked or inserted by this transaction) */
static void
update_row(RecordAccess *ra, ItemPointer tid, Datum *values, bool *nulls)
{
	access_update_row(&record_table.checks, ra->rel, ra->rri, ra->estate, ra->slot, tid,
					  values, nulls);
}

/*
 * The floor is read twice.  Once before the insert, an estimate, to write
 * the right attempt at once in the common case.  And once the insert has
 * won, exactly: the unique index then made sure that every earlier version
 * of the key was deleted by a committed transaction, whose raise of the
 * floor the second read sees; if it caught up with the attempt, the
 * attempt moves above it.
 */
static bool
direct_insert_claim(RecordAccess *ra, const IdemKey *key,
					const IdemFingerprint *fp, TimestampTz now,
					TimestampTz lease_expires_at, TimestampTz expires_at,
					const char *trace, int32 *attempt)
{
	int			natts;
	Datum	   *values;
	bool	   *nulls;
	IdemRecord	claim;
	int32		bucket = floor_bucket(key);
	int32		floor;

	direct_prepare_write(ra);
	natts = RelationGetDescr(ra->rel)->natts;
	values = palloc0(natts * sizeof(Datum));
	nulls = palloc(natts * sizeof(bool));
	memset(nulls, true, natts * sizeof(bool));

	claim.state = IDEM_PENDING;
	claim.retryable = false;
	claim.fingerprint = *fp;
	claim.has_status = false;
	claim.status = 0;
	claim.body = NULL;
	claim.headers = NULL;
	claim.attempt = *attempt = attempt_floor(ra, bucket, false) + 1;
	claim.created_at = now;
	claim.lease_expires_at = lease_expires_at;
	claim.expires_at = expires_at;
	claim.trace = trace;
	set_column(values, nulls, C_TENANT, PointerGetDatum(key->tenant), false);
	set_column(values, nulls, C_ENDPOINT, PointerGetDatum(key->endpoint),
			   false);
	set_column(values, nulls, C_KEY, PointerGetDatum(key->key), false);
	set_record(values, nulls, &claim, now);
	access_store_row(&record_table.checks, ra->rel, ra->slot, values, nulls);
	if (!access_insert_speculative(ra->rri, ra->estate, ra->slot,
								   ra->arbiters))
		return false;
	CommandCounterIncrement();

	floor = attempt_floor(ra, bucket, true);
	if (floor >= *attempt)
	{
		ItemPointerData tid = ra->slot->tts_tid;

		*attempt = floor + 1;
		set_column(values, nulls, C_ATTEMPT, Int32GetDatum(*attempt), false);
		update_row(ra, &tid, values, nulls);
	}
	return true;
}

/*
 * Lock the version probed, and read it into the slot: RECORD_CHANGED if it
 * is no longer the newest (the caller probes again), RECORD_WRITE_BUSY if
 * another transaction holds it and wait is false.
 *
 * The snapshot passed is the statement's, as ExecOnConflictLockRow passes
 * it: the heap locks the version at tid whatever a snapshot shows, and
 * says whether it was changed since.
 *
 * With wait, a lock held by another transaction is waited for (a lock
 * wait: lock_timeout and the deadlock detector apply), and then the answer
 * is RECORD_CHANGED even when the version did not change: whatever the
 * caller decided, and the timestamps it was about to write, date from
 * before the wait.  Probing again finds the row locked by this
 * transaction, and the next lock is granted at once.
 */
static RecordWrite
lock_probed(RecordAccess *ra, const IdemRecord *probed, bool wait)
{
	ItemPointerData tid = probed->tid;
	TM_Result	result;

	direct_prepare_write(ra);
	result = access_lock_row(ra->rel, &tid, GetActiveSnapshot(), ra->slot,
							 LockWaitSkip, false, "idem record");
	if (result == TM_WouldBlock && wait)
	{
		result = access_lock_row(ra->rel, &tid, GetActiveSnapshot(),
								 ra->slot, LockWaitBlock, false,
								 "idem record");
		if (result == TM_Ok)
			return RECORD_CHANGED;
	}
	if (result == TM_Ok)
		return RECORD_WRITTEN;
	return result == TM_WouldBlock ? RECORD_WRITE_BUSY : RECORD_CHANGED;
}

/* record_write: only the columns that differ change */
static RecordWrite
direct_write(RecordAccess *ra, const IdemKey *key, const IdemRecord *probed,
			 const IdemRecord *next, TimestampTz now, bool wait)
{
	RecordWrite result;
	Datum	   *values;
	bool	   *nulls;
	ItemPointerData tid = probed->tid;

	result = lock_probed(ra, probed, wait);
	if (result != RECORD_WRITTEN)
		return result;
	access_copy_row(ra->slot, &values, &nulls);
	set_record(values, nulls, next, now);
	update_row(ra, &tid, values, nulls);
	return RECORD_WRITTEN;
}

/*
 * Wait for a transaction that is writing the key's record, then delete it
 * through SQL, so that the trigger raises the fencing floor
 */
static bool
direct_forget(RecordAccess *ra, const IdemKey *key)
{
	bool		busy;

	(void) probe(ra, key, true, false, RECORD_FOR_FORGET, &busy);
	return sql_delete(ra, key);
}

static const RecordMethods direct_methods = RECORD_METHODS(direct);
