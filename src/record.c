/*-------------------------------------------------------------------------
 *
 * record.c
 *	  The only code that knows idem_record's columns, with record_sql.c.
 *
 * A local idem_record is read and written directly, the way core's
 * logical replication apply and INSERT ... ON CONFLICT do it: no SPI, no
 * plan, no per-key heavyweight lock.  The table, its unique key index and
 * the fencing floor are opened by OIDs cached per backend and looked up
 * again after a relcache invalidation of either table.
 *
 * - A read (a replay, or a claim's first look) scans the unique index with
 *   the active snapshot.
 * - A probe scans it with a dirty snapshot, which shows a version that
 *   another transaction is inserting, updating or deleting: a claim then
 *   answers in_progress at once, or with wait waits for that transaction
 *   (XactLockTableWait: lock_timeout, the deadlock detector and cancel
 *   apply, and a prepared transaction is waited for until it is finished).
 *   A version being deleted (a purge of an expired record, idem_forget, a
 *   DELETE by hand) is no exception: the deleter may be waiting itself
 *   (the floor's trigger, for an operator's open transaction) for as long
 *   as that transaction lasts, and a claim without wait never waits for an
 *   unrelated transaction.  Whether the deleter commits (the record is
 *   gone and its bucket's floor raised) or aborts (the record stays), a
 *   claim that answered in_progress executed nothing and gave out no
 *   attempt, and the next claim decides over what the deleter left.
 *   idem_replay never waits either; it answers from its snapshot.
 * - A fresh claim inserts speculatively, as INSERT ... ON CONFLICT does: a
 *   speculative heap insert, then the index entries with every unique
 *   index on the key columns as arbiter; if a concurrent insert of the same
 *   key won, the heap tuple is killed (heap_abort_speculative) and the
 *   protocol probes again.  Two claims can therefore never both insert a
 *   key, and neither waits for the other's transaction (only, briefly, for
 *   the other's speculative insertion, on one side only, as core's livelock
 *   rule says).  The arbiters include the indexes that REINDEX CONCURRENTLY
 *   builds and retires (key_arbiters), which check uniqueness too; the
 *   probe needs only idem_record_key, which has an entry for every live
 *   version.
 * - A re-claim and a finish lock the probed version (it must still be the
 *   newest, else the protocol probes again) and update it.  A finish
 *   changes no indexed column, so it is a HOT update when the page has room.
 *   If another transaction holds the row's lock, a caller that waits waits
 *   for it, and then probes and decides again, as of after the wait.
 *
 * Nothing here deletes a record: the purge and idem_forget go through SQL
 * (record_sql.c), so the AFTER DELETE trigger raises the fencing floor for
 * every deletion.  Before a purge batch deletes, though, it takes the floor
 * rows of the buckets it deletes from here (idem_hold_floor), without
 * waiting, so that its trigger never waits for another transaction.
 *
 * A heap insert or update applies none of the table's constraints: every
 * row written goes through ExecConstraints first (access_check_row), so a
 * CHECK that a DBA adds is enforced here as on the SQL way, its error
 * naming the constraint and the table.  Row triggers are not fired on this
 * path: idem_record has none, and one that a DBA adds fires only for the
 * SQL way's writes (doc/choices.md); the statement trigger on DELETE fires
 * for the SQL that deletes.
 *
 * A table that Citus distributes goes through SQL (record_sql.c) for every
 * operation: on a coordinator the local table is an empty shell.  The same
 * rules for waits hold there (a row lock asked for without waiting first,
 * a probe again after any wait), with a lock per key in place of the dirty
 * snapshot.  Which way a table goes is decided when its OIDs are looked
 * up, so again after every relcache invalidation.
 *
 * Callers bracket their calls with record_open() and record_close();
 * values read from the table are copied into the memory context that was
 * current at record_open().  A batch (record_batch_begin() to
 * record_batch_end()) keeps one bracket open across many calls, so that
 * what they share is set up once: the relations, the slot, the executor
 * state and the switch to the table's owner.
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
#include "record.h"

/* idem_record's columns, found by name when the table is looked up */
typedef enum RecordColumn
{
	C_TENANT,
	C_ENDPOINT,
	C_KEY,
	C_STATE,
	C_RETRYABLE,
	C_FINGERPRINT,
	C_STATUS,
	C_BODY,
	C_ATTEMPT,
	C_CREATED_AT,
	C_CLAIMED_AT,
	C_LEASE_EXPIRES_AT,
	C_FINISHED_AT,
	C_EXPIRES_AT,
	C_HEADERS,
	NUM_COLUMNS
} RecordColumn;

static const char *const column_names[NUM_COLUMNS] = {
	[C_TENANT] = "tenant",
	[C_ENDPOINT] = "endpoint",
	[C_KEY] = "key",
	[C_STATE] = "state",
	[C_RETRYABLE] = "retryable",
	[C_FINGERPRINT] = "fingerprint",
	[C_STATUS] = "status",
	[C_BODY] = "body",
	[C_ATTEMPT] = "attempt",
	[C_CREATED_AT] = "created_at",
	[C_CLAIMED_AT] = "claimed_at",
	[C_LEASE_EXPIRES_AT] = "lease_expires_at",
	[C_FINISHED_AT] = "finished_at",
	[C_EXPIRES_AT] = "expires_at",
	[C_HEADERS] = "headers"
};

/* What this backend knows of the tables, until a relcache invalidation */
typedef struct RecordTables
{
	bool		valid;
	bool		distributed;	/* through SQL: record_sql.c */
	Oid			record;
	Oid			key_index;
	Oid			floor;
	Oid			floor_index;
	Oid			owner;			/* idem_record's owner */
	AttrNumber	attnum[NUM_COLUMNS];
} RecordTables;

static RecordTables tables;
static AccessChecks checks;
static bool callback_registered = false;

/* One open bracket's state */
typedef struct RecordAccess
{
	MemoryContext caller;
	MemoryContext bracket;		/* current when the bracket was opened */
	bool		batch;			/* record_open/close only switch "caller" */
	Oid			caller_userid;
	int			caller_sec_context;
	Relation	rel;
	Relation	key_index;
	TupleTableSlot *slot;
	/* for writing, set up at the first write */
	EState	   *estate;
	ResultRelInfo *rri;
	List	   *arbiters;		/* of a claim's insert: key_arbiters() */
	/* the version that the last probe found */
	ItemPointerData probed;
} RecordAccess;

static RecordAccess acc;

static void
record_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == tables.record || relid == tables.floor)
	{
		tables.valid = false;
		checks.valid = false;
	}
}

/*
 * Find the extension's tables, their indexes and idem_record's columns,
 * and decide which way the table is reached.  Refuses a table that is not
 * stored by the heap access method: the direct path reads heap tuples.
 */
static void
look_up_tables(void)
{
	Oid			schema;
	Relation	rel;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(record_invalidate, (Datum) 0);
		callback_registered = true;
	}

	schema = idem_extension_schema();
	tables.record = access_table("idem_record", schema);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	tables.distributed = sql_distributed(tables.record);
	SPI_finish();

	tables.floor = access_table("idem_attempt_floor", schema);
	tables.key_index = access_index_of("idem_record_key", schema, tables.record);
	tables.floor_index = access_index_of("idem_attempt_floor_pkey", schema,
								  tables.floor);

	rel = table_open(tables.record, AccessShareLock);
	if (!tables.distributed)
		access_require_heap(rel);
	tables.owner = rel->rd_rel->relowner;
	access_columns(rel, column_names, NUM_COLUMNS, tables.attnum);
	table_close(rel, AccessShareLock);
	tables.valid = true;
}

/*
 * idem_record's OID, for the callers that need to know about the table
 * itself (subscription.c): looked up like every bracket's tables.
 */
Oid
record_relation(void)
{
	if (!tables.valid)
		look_up_tables();
	return tables.record;
}

/*
 * Start a bracket of calls.  The table and its key index are opened with
 * AccessShareLock (a replay on a standby can take no stronger lock); the
 * first write takes RowExclusiveLock.
 *
 * The API functions run as their caller, so that the tenant binding sees
 * who calls; only the table is the extension owner's.  Between
 * record_open() and record_close() idem runs as the table's owner (for the
 * SQL statements: direct access checks no privileges), the way core's
 * foreign key triggers switch to a table's owner: an error in between
 * restores the caller's user with the (sub)transaction's abort.
 */
void
record_open(void)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			userid;
	int			sec_context;

	if (acc.batch)
	{
		acc.caller = caller;
		if (acc.estate != NULL)
			ResetPerTupleExprContext(acc.estate);
		return;
	}
	if (!tables.valid)
		look_up_tables();
	GetUserIdAndSecContext(&userid, &sec_context);
	SetUserIdAndSecContext(tables.owner,
						   sec_context | SECURITY_LOCAL_USERID_CHANGE);
	memset(&acc, 0, sizeof(acc));
	acc.caller = caller;
	acc.bracket = caller;
	acc.caller_userid = userid;
	acc.caller_sec_context = sec_context;
	if (tables.distributed)
	{
		sql_open(caller);
		return;
	}
	acc.rel = table_open(tables.record, AccessShareLock);
	acc.key_index = index_open(tables.key_index, AccessShareLock);
	acc.slot = table_slot_create(acc.rel, NULL);
}

void
record_close(void)
{
	if (acc.batch)
		return;
	if (tables.distributed)
		sql_close();
	else
	{
		if (acc.estate != NULL)
		{
			ExecCloseIndices(acc.rri);
			FreeExecutorState(acc.estate);
		}
		ExecDropSingleTupleTableSlot(acc.slot);
		index_close(acc.key_index, NoLock);
		table_close(acc.rel, NoLock);
	}
	SetUserIdAndSecContext(acc.caller_userid, acc.caller_sec_context);
	memset(&acc, 0, sizeof(acc));
}

/*
 * The arbiters of a claim's speculative insertion among the indexes that
 * rri opened: every unique index on exactly the key columns, as
 * infer_arbiter_indexes() picks them for ON CONFLICT (tenant, endpoint,
 * key), valid or not.  REINDEX CONCURRENTLY builds a second unique index
 * (idem_record_key_ccnew), which takes entries and checks uniqueness before
 * it is valid, and after the swap retires the old one
 * (idem_record_key_ccold), which takes entries until it is dead; a unique
 * index that is not an arbiter waits for a concurrent inserter of the key
 * and then fails with a unique violation, where a claim must probe again
 * and answer in_progress.  An index not ready for entries is skipped by
 * ExecInsertIndexTuples.
 */
static List *
key_arbiters(ResultRelInfo *rri)
{
	List	   *arbiters = NIL;

	for (int i = 0; i < rri->ri_NumIndices; i++)
	{
		Form_pg_index index = rri->ri_IndexRelationDescs[i]->rd_index;
		IndexInfo  *info = rri->ri_IndexRelationInfo[i];
		bool		on_key = true;

		if (!index->indisunique || index->indisexclusion ||
			!index->indimmediate || info->ii_Expressions != NIL ||
			info->ii_Predicate != NIL || info->ii_NumIndexKeyAttrs != 3)
			continue;
		for (int c = C_TENANT; c <= C_KEY; c++)
		{
			bool		found = false;

			for (int k = 0; k < info->ii_NumIndexKeyAttrs; k++)
				found |= info->ii_IndexAttrNumbers[k] == tables.attnum[c];
			on_key &= found;
		}
		if (on_key)
			arbiters = lappend_oid(arbiters, index->indexrelid);
	}
	return arbiters;
}

/*
 * Start a batch: one bracket for all the calls up to record_batch_end().
 * Inside it, record_open() and record_close() only set the memory context
 * that values read are copied into (and reset the executor state's
 * per-tuple memory), so the caller may reset its own context after each
 * element and a batch of any length runs in bounded memory.  The SQL way
 * keeps no state worth sharing (its plans are kept per backend anyway):
 * for a distributed table a batch is a loop of ordinary brackets.
 */
void
record_batch_begin(void)
{
	if (!tables.valid)
		look_up_tables();
	if (tables.distributed)
		return;
	record_open();
	acc.batch = true;
}

void
record_batch_end(void)
{
	if (!acc.batch)
		return;
	acc.batch = false;
	acc.caller = acc.bracket;
	record_close();
}

/*
 * Forget a batch that an error interrupted.  The (sub)transaction's abort
 * closes the relations, drops the slot's pin and restores the caller's
 * user; only this file's own state must not outlive it.
 */
void
record_batch_abandon(void)
{
	memset(&acc, 0, sizeof(acc));
}

/*
 * Set up for writing: RowExclusiveLock on the table and its indexes, and
 * the executor state that maintaining the indexes needs, which lives as
 * long as the bracket (a batch's, across its elements).
 */
static void
prepare_write(void)
{
	MemoryContext old;

	if (acc.estate != NULL)
		return;
	LockRelationOid(tables.record, RowExclusiveLock);
	old = MemoryContextSwitchTo(acc.bracket);
	acc.estate = CreateExecutorState();
	acc.rri = makeNode(ResultRelInfo);
	InitResultRelInfo(acc.rri, acc.rel, 0, NULL, 0);
	ExecOpenIndices(acc.rri, true);
	acc.arbiters = key_arbiters(acc.rri);
	MemoryContextSwitchTo(old);
}

/*
 * Take the locks that a write of the bracket will take, before the caller
 * reads the clock for it: a claim dates its record after every wait, and
 * RowExclusiveLock on idem_record waits for a CREATE INDEX or REINDEX that
 * holds ShareLock (and the floor's lock for DDL on the floor).  A replay
 * never calls this, so it goes on answering meanwhile.  On the SQL way the
 * statements take their own locks; the table's is taken here all the same.
 */
void
record_prepare_write(void)
{
	LockRelationOid(tables.record, RowExclusiveLock);
	LockRelationOid(tables.floor, AccessShareLock);
	if (!tables.distributed)
		prepare_write();
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

/* Copy the record in acc.slot into rec */
static void
deform_record(IdemRecord *rec)
{
	TupleTableSlot *slot = acc.slot;
	bool		isnull;
	Datum		d;
	char	   *state;
	MemoryContext old;

#define COLUMN(c) slot_getattr(slot, tables.attnum[c], &isnull)

	state = TextDatumGetCString(COLUMN(C_STATE));
	if (strcmp(state, record_state_names[IDEM_PENDING]) == 0)
		rec->state = IDEM_PENDING;
	else if (strcmp(state, record_state_names[IDEM_SUCCEEDED]) == 0)
		rec->state = IDEM_SUCCEEDED;
	else if (strcmp(state, record_state_names[IDEM_FAILED]) == 0)
		rec->state = IDEM_FAILED;
	else
		elog(ERROR, "idem_record has an unknown state \"%s\"", state);
	rec->retryable = DatumGetBool(COLUMN(C_RETRYABLE));

	d = COLUMN(C_FINGERPRINT);
	rec->fingerprint.present = !isnull;
	if (!isnull)
		memcpy(rec->fingerprint.digest, VARDATA_ANY(DatumGetByteaPP(d)),
			   IDEM_FINGERPRINT_LEN);

	d = COLUMN(C_STATUS);
	rec->has_status = !isnull;
	rec->status = isnull ? 0 : DatumGetInt32(d);

	d = COLUMN(C_BODY);
	old = MemoryContextSwitchTo(acc.caller);
	rec->body = isnull ? NULL : DatumGetByteaPCopy(d);
	MemoryContextSwitchTo(old);

	d = COLUMN(C_HEADERS);
	old = MemoryContextSwitchTo(acc.caller);
	rec->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	MemoryContextSwitchTo(old);

	rec->attempt = DatumGetInt32(COLUMN(C_ATTEMPT));
	rec->created_at = DatumGetTimestampTz(COLUMN(C_CREATED_AT));
	rec->lease_expires_at = DatumGetTimestampTz(COLUMN(C_LEASE_EXPIRES_AT));
	rec->expires_at = DatumGetTimestampTz(COLUMN(C_EXPIRES_AT));
#undef COLUMN
}

/*
 * Read the key's record as the active snapshot shows it into rec; false if
 * there is none.  A read-only look-up: no new snapshot, nothing written.
 */
bool
record_fetch(const IdemKey *key, IdemRecord *rec)
{
	ScanKeyData skeys[3];
	IndexScanDesc scan;
	bool		found;

	if (tables.distributed)
		return sql_fetch(key, false, rec);

	key_scankeys(key, skeys);
	scan = idem_index_beginscan(acc.rel, acc.key_index,
								GetActiveSnapshot(), 3);
	index_rescan(scan, skeys, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, acc.slot);
	index_endscan(scan);
	if (found)
		deform_record(rec);
	return found;
}

/*
 * Look the key up with a dirty snapshot.  Returns RECORD_BUSY (and sets
 * *busy) if another transaction is inserting, updating or deleting the
 * key's record; with wait, it waits for that transaction and looks again
 * instead.  A read_only probe never waits, and a version being deleted
 * does not make the key busy for it.  Otherwise the slot holds the newest
 * version, which this transaction may act on if it still is the newest
 * when it locks it.
 *
 * The first version the scan returns decides: the unique index lets a
 * second one of the key exist only while another transaction is writing
 * it, and then either one shows that transaction.
 */
static RecordProbe
probe(const IdemKey *key, bool wait, bool read_only, bool *busy)
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

		scan = idem_index_beginscan(acc.rel, acc.key_index, &dirty, 3);
		index_rescan(scan, skeys, 3, NULL, 0);
		if (!index_getnext_slot(scan, ForwardScanDirection, acc.slot))
		{
			index_endscan(scan);
			return RECORD_ABSENT;
		}
		index_endscan(scan);
		tid = acc.slot->tts_tid;
		xwait = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
		if (!TransactionIdIsValid(xwait))
		{
			acc.probed = tid;
			return RECORD_FOUND;
		}

		/* a version that another transaction deleted points to itself */
		if (TransactionIdIsValid(dirty.xmin))
			deleting = false;
		else
		{
			HeapTuple	tuple = ExecFetchSlotHeapTuple(acc.slot, false,
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
		XactLockTableWait(xwait, acc.rel, &tid, XLTW_InsertIndex);
	}
}

/*
 * What another transaction leaves of the key's record: RECORD_ABSENT,
 * RECORD_BUSY while another transaction writes it (with wait: until it
 * ends), or RECORD_FOUND with the newest version in rec; *own (if not
 * NULL) tells whether this transaction wrote that version.  With the SQL
 * way, the key's lock is taken too; record_unlock gives it back.
 */
RecordProbe
record_probe(const IdemKey *key, bool wait, IdemRecord *rec, bool *own)
{
	RecordProbe result;
	bool		busy;

	if (tables.distributed)
		return sql_probe(key, wait, rec, own);
	result = probe(key, wait, false, &busy);
	if (own != NULL)
		*own = false;
	if (result == RECORD_FOUND)
	{
		HeapTuple	tuple = ExecFetchSlotHeapTuple(acc.slot, false, NULL);

		if (own != NULL)
			*own = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
		deform_record(rec);
	}
	return result;
}

/*
 * Whether another transaction is inserting or updating the key's record,
 * asked without waiting and without locking anything (idem_replay).  A
 * record being deleted is not busy: the caller's snapshot decides.
 */
bool
record_busy(const IdemKey *key)
{
	bool		busy;

	if (tables.distributed)
		return sql_busy(key);
	(void) probe(key, false, true, &busy);
	return busy;
}

/* Give back what record_probe took when nothing was written */
void
record_unlock(const IdemKey *key)
{
	if (tables.distributed)
		sql_unlock(key);
}

/* Store a value in a row being built */
static void
set_column(Datum *values, bool *nulls, RecordColumn c, Datum value,
		   bool isnull)
{
	values[tables.attnum[c] - 1] = value;
	nulls[tables.attnum[c] - 1] = isnull;
}

static Datum
fingerprint_datum(const IdemFingerprint *fp)
{
	bytea	   *b = (bytea *) palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	SET_VARSIZE(b, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(b), fp->digest, IDEM_FINGERPRINT_LEN);
	return PointerGetDatum(b);
}

/*
 * The fencing floor of the key's bucket (0 if none), as the newest
 * committed state shows it.
 */
static int32
attempt_floor(const IdemKey *key)
{
	int32		bucket;
	Relation	floor;
	Relation	index;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	int32		result = 0;

	bucket = DatumGetInt32(DirectFunctionCall1Coll(hashtext, C_COLLATION_OID,
												   PointerGetDatum(key->key)))
		& (IDEM_FLOOR_BUCKETS - 1);
	floor = table_open(tables.floor, AccessShareLock);
	index = index_open(tables.floor_index, AccessShareLock);
	slot = table_slot_create(floor, NULL);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(bucket));
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = idem_index_beginscan(floor, index, snapshot, 1);
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		result = DatumGetInt32(slot_getattr(slot, 2, &isnull));
	}
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(floor, NoLock);
	return result;
}

/*
 * Insert bucket's floor row, with attempt 1, speculatively: false, and
 * nothing inserted, if another transaction inserted the bucket's row first
 * (its insertion is not waited for, as in record_insert_claim).
 */
static bool
insert_floor(ResultRelInfo *rri, EState *estate, TupleTableSlot *slot,
			 int32 bucket)
{
	Relation	floor = rri->ri_RelationDesc;
	uint32		token;
	bool		conflict = false;

	ExecClearTuple(slot);
	slot->tts_values[0] = Int32GetDatum(bucket);
	slot->tts_values[1] = Int32GetDatum(1);
	slot->tts_isnull[0] = slot->tts_isnull[1] = false;
	ExecStoreVirtualTuple(slot);

	token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
	table_tuple_insert_speculative(floor, slot, GetCurrentCommandId(true), 0,
								   NULL, token);
	idem_insert_index_tuples(rri, estate, slot, true, false, &conflict,
							 list_make1_oid(tables.floor_index));
	table_tuple_complete_speculative(floor, slot, token, !conflict);
	SpeculativeInsertionLockRelease(GetCurrentTransactionId());
	return !conflict;
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
idem_hold_floor(const int32 *buckets, int n, bool *held)
{
	Relation	floor;
	Relation	index;
	TupleTableSlot *slot;
	EState	   *estate = NULL;
	ResultRelInfo *rri = NULL;
	SnapshotData dirty;

	floor = table_open(tables.floor, RowExclusiveLock);
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
			TM_FailureData tmfd;
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
				held[i] = insert_floor(rri, estate, slot, buckets[i]);
				break;
			}
			if (TransactionIdIsValid(dirty.xmin) ||
				TransactionIdIsValid(dirty.xmax))
			{
				held[i] = false;	/* another transaction is writing it */
				break;
			}
			tid = slot->tts_tid;
			result = table_tuple_lock(floor, &tid, GetLatestSnapshot(), slot,
									  GetCurrentCommandId(false),
									  LockTupleNoKeyExclusive, LockWaitSkip,
									  0, &tmfd);
			if (result == TM_Ok || result == TM_WouldBlock)
			{
				held[i] = result == TM_Ok;
				break;
			}
			/* changed and committed since the look-up: look again */
			if (result != TM_Updated && result != TM_Deleted)
				elog(ERROR, "unexpected table_tuple_lock status: %u", result);
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

/* Replace the version at tid (locked or inserted by this transaction) */
static void
update_row(ItemPointer tid, Datum *values, bool *nulls)
{
	access_update_row(&checks, acc.rel, acc.rri, acc.estate, acc.slot, tid,
					  values, nulls);
}

/*
 * Insert a fresh pending claim; false if a concurrent transaction inserted
 * the key first (the caller probes again).  *attempt is the new claim's
 * attempt: one more than the fencing floor of the key's bucket.
 *
 * The floor is read twice.  Once before the insert, to write the right
 * attempt at once.  And once the insert has won: the unique index then
 * made sure that every earlier version of the key was deleted by a
 * committed transaction, whose raise of the floor the second read sees;
 * if it caught up with the attempt, the attempt moves above it.
 */
bool
record_insert_claim(const IdemKey *key, const IdemFingerprint *fp,
					TimestampTz now, TimestampTz lease_expires_at,
					TimestampTz expires_at, int32 *attempt)
{
	TupleTableSlot *slot = acc.slot;
	int			natts;
	Datum	   *values;
	bool	   *nulls;
	uint32		token;
	bool		conflict = false;
	int32		floor;

	if (tables.distributed)
		return sql_insert_claim(key, fp, now, lease_expires_at, expires_at,
								attempt);

	prepare_write();
	natts = RelationGetDescr(acc.rel)->natts;
	values = palloc0(natts * sizeof(Datum));
	nulls = palloc(natts * sizeof(bool));
	memset(nulls, true, natts * sizeof(bool));

	*attempt = attempt_floor(key) + 1;
	set_column(values, nulls, C_TENANT, PointerGetDatum(key->tenant), false);
	set_column(values, nulls, C_ENDPOINT, PointerGetDatum(key->endpoint),
			   false);
	set_column(values, nulls, C_KEY, PointerGetDatum(key->key), false);
	set_column(values, nulls, C_STATE,
			   CStringGetTextDatum(record_state_names[IDEM_PENDING]), false);
	set_column(values, nulls, C_RETRYABLE, BoolGetDatum(false), false);
	if (fp->present)
		set_column(values, nulls, C_FINGERPRINT, fingerprint_datum(fp), false);
	set_column(values, nulls, C_ATTEMPT, Int32GetDatum(*attempt), false);
	set_column(values, nulls, C_CREATED_AT, TimestampTzGetDatum(now), false);
	set_column(values, nulls, C_CLAIMED_AT, TimestampTzGetDatum(now), false);
	set_column(values, nulls, C_LEASE_EXPIRES_AT,
			   TimestampTzGetDatum(lease_expires_at), false);
	set_column(values, nulls, C_EXPIRES_AT, TimestampTzGetDatum(expires_at),
			   false);
	access_store_row(&checks, acc.rel, slot, values, nulls);

	token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
	table_tuple_insert_speculative(acc.rel, slot,
								   GetCurrentCommandId(true), 0, NULL, token);
	idem_insert_index_tuples(acc.rri, acc.estate, slot, true, false,
							 &conflict, acc.arbiters);
	table_tuple_complete_speculative(acc.rel, slot, token, !conflict);
	SpeculativeInsertionLockRelease(GetCurrentTransactionId());
	if (conflict)
		return false;
	CommandCounterIncrement();

	floor = attempt_floor(key);
	if (floor >= *attempt)
	{
		ItemPointerData tid = slot->tts_tid;

		*attempt = floor + 1;
		set_column(values, nulls, C_ATTEMPT, Int32GetDatum(*attempt), false);
		update_row(&tid, values, nulls);
	}
	return true;
}

/*
 * Lock the version that the last probe found, and read it into the slot:
 * RECORD_CHANGED if it is no longer the newest (the caller probes again),
 * RECORD_WRITE_BUSY if another transaction holds it and wait is false.
 *
 * With wait, a lock held by another transaction is waited for (a lock
 * wait: lock_timeout and the deadlock detector apply), and then the answer
 * is RECORD_CHANGED even when the version did not change: whatever the
 * caller decided, and the timestamps it was about to write, date from
 * before the wait.  Probing again finds the row locked by this
 * transaction, and the next lock is granted at once.
 */
static RecordWrite
lock_probed(bool wait)
{
	TM_FailureData tmfd;
	TM_Result	result;
	bool		waited = false;

	prepare_write();
	result = table_tuple_lock(acc.rel, &acc.probed, GetLatestSnapshot(),
							  acc.slot, GetCurrentCommandId(false),
							  LockTupleNoKeyExclusive, LockWaitSkip, 0, &tmfd);
	if (result == TM_WouldBlock && wait)
	{
		result = table_tuple_lock(acc.rel, &acc.probed, GetLatestSnapshot(),
								  acc.slot, GetCurrentCommandId(false),
								  LockTupleNoKeyExclusive, LockWaitBlock, 0,
								  &tmfd);
		waited = true;
	}
	switch (result)
	{
		case TM_Ok:
			return waited ? RECORD_CHANGED : RECORD_WRITTEN;
		case TM_WouldBlock:
			return RECORD_WRITE_BUSY;
		case TM_Updated:
		case TM_Deleted:
		case TM_SelfModified:
			return RECORD_CHANGED;
		default:
			elog(ERROR, "unexpected table_tuple_lock status: %u", result);
	}
	pg_unreachable();
}

/*
 * Turn the key's record, as the last probe found it, into the pending
 * claim described by rec.  RECORD_CHANGED if another transaction changed
 * it since; RECORD_WRITE_BUSY if one holds it and wait is false.
 */
RecordWrite
record_reclaim(const IdemKey *key, const IdemRecord *rec, TimestampTz now,
			   bool wait)
{
	RecordWrite result;
	Datum	   *values;
	bool	   *nulls;
	ItemPointerData tid;

	if (tables.distributed)
		return sql_reclaim(key, rec, now, wait);

	result = lock_probed(wait);
	if (result != RECORD_WRITTEN)
		return result;
	tid = acc.probed;
	access_copy_row(acc.slot, &values, &nulls);
	set_column(values, nulls, C_STATE,
			   CStringGetTextDatum(record_state_names[IDEM_PENDING]), false);
	set_column(values, nulls, C_RETRYABLE, BoolGetDatum(false), false);
	set_column(values, nulls, C_FINGERPRINT,
			   rec->fingerprint.present ?
			   fingerprint_datum(&rec->fingerprint) : (Datum) 0,
			   !rec->fingerprint.present);
	set_column(values, nulls, C_STATUS, (Datum) 0, true);
	set_column(values, nulls, C_BODY, (Datum) 0, true);
	set_column(values, nulls, C_HEADERS, (Datum) 0, true);
	set_column(values, nulls, C_ATTEMPT, Int32GetDatum(rec->attempt), false);
	set_column(values, nulls, C_CREATED_AT,
			   TimestampTzGetDatum(rec->created_at), false);
	set_column(values, nulls, C_CLAIMED_AT, TimestampTzGetDatum(now), false);
	set_column(values, nulls, C_LEASE_EXPIRES_AT,
			   TimestampTzGetDatum(rec->lease_expires_at), false);
	set_column(values, nulls, C_FINISHED_AT, (Datum) 0, true);
	set_column(values, nulls, C_EXPIRES_AT,
			   TimestampTzGetDatum(rec->expires_at), false);
	update_row(&tid, values, nulls);
	return RECORD_WRITTEN;
}

/*
 * Store how the key's pending claim, as the last probe found it, ended
 * (its status, body and headers);
 * waits for a transaction that holds it.  RECORD_CHANGED if another
 * transaction changed it since.  Only non-indexed columns change: a HOT
 * update when the page has room.
 */
RecordWrite
record_finish(const IdemKey *key, IdemState state, bool retryable,
			  bool has_status, int32 status, bytea *body, Jsonb *headers,
			  TimestampTz now)
{
	RecordWrite result;
	Datum	   *values;
	bool	   *nulls;
	ItemPointerData tid;

	if (tables.distributed)
		return sql_finish(key, state, retryable, has_status, status, body,
						  headers, now);

	result = lock_probed(true);
	if (result != RECORD_WRITTEN)
		return result;
	tid = acc.probed;
	access_copy_row(acc.slot, &values, &nulls);
	set_column(values, nulls, C_STATE,
			   CStringGetTextDatum(record_state_names[state]), false);
	set_column(values, nulls, C_RETRYABLE, BoolGetDatum(retryable), false);
	set_column(values, nulls, C_STATUS, Int32GetDatum(status), !has_status);
	set_column(values, nulls, C_BODY, PointerGetDatum(body), body == NULL);
	set_column(values, nulls, C_HEADERS, PointerGetDatum(headers),
			   headers == NULL);
	set_column(values, nulls, C_FINISHED_AT, TimestampTzGetDatum(now), false);
	update_row(&tid, values, nulls);
	return RECORD_WRITTEN;
}

/*
 * The purge, the listing and idem_forget go through SQL on every table:
 * they are not on a request's path, and a deletion must fire the trigger
 * that raises the fencing floor.
 *
 * The relations the purge on this node goes through: the local
 * idem_record, or the shard placements of a distributed one that this node
 * holds (sql_purge_targets).
 */
List *
record_purge_targets(bool *distributed)
{
	List	   *targets;

	if (tables.distributed)
		return sql_purge_targets(distributed);
	sql_open(acc.caller);
	targets = sql_purge_targets(distributed);
	sql_close();
	return targets;
}

uint64
record_purge_batch(Oid target, TimestampTz now, int batch,
				   IdemPurgeScan *scan, bool *more)
{
	uint64		deleted;

	if (tables.distributed)
		return sql_purge_batch(target, now, batch, scan, more);
	sql_open(acc.caller);
	deleted = sql_purge_batch(target, now, batch, scan, more);
	sql_close();
	return deleted;
}

List *
record_list(text *tenant, text *endpoint, bool with_body, int32 max_rows,
			TupleDesc desc)
{
	List	   *rows;

	if (tables.distributed)
		return sql_list(tenant, endpoint, with_body, max_rows, desc);
	sql_open(acc.caller);
	rows = sql_list(tenant, endpoint, with_body, max_rows, desc);
	sql_close();
	return rows;
}

/*
 * Delete the key's record, whatever its state; false if it had none.
 * Waits first for a transaction that is writing it.
 */
bool
record_forget(const IdemKey *key)
{
	bool		forgotten;
	bool		busy;

	if (tables.distributed)
	{
		IdemRecord	rec;

		(void) sql_probe(key, true, &rec, NULL);
		return sql_forget(key);
	}
	(void) probe(key, true, false, &busy);
	sql_open(acc.caller);
	forgotten = sql_forget(key);
	sql_close();
	return forgotten;
}
