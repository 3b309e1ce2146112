/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The outbox: outbound messages that a business transaction writes and
 *	  a dispatcher delivers, as decisions over a message's state.
 *
 * The only code that knows idem_outbox's columns.  It reaches the table as
 * record.c reaches idem_record: directly through its indexes and the heap,
 * no SPI, no plan, no heavyweight lock per message; the table's CHECK and
 * NOT NULL constraints are applied by ExecConstraints, and its indexes
 * (partial ones included) maintained by ExecInsertIndexTuples, as
 * execReplication.c does.  What one call needs is an Outbox, passed to
 * every function; nothing outlives the call but the tables' OIDs.
 *
 * Why it is correct:
 * - An enqueue inserts speculatively with the unique (tenant, topic, key)
 *   index as arbiter, as INSERT ... ON CONFLICT does: two enqueues of one
 *   key never both insert.  On a conflict it looks at the key with a dirty
 *   snapshot; a version that another transaction is inserting or deleting
 *   is waited for (SpeculativeInsertionWait, XactLockTableWait), because
 *   only its end tells whether the key exists: a rolled-back enqueue
 *   leaves nothing, and the waiter then inserts.  Once the key's message
 *   is committed (or this transaction's own), its payload decides between
 *   duplicate and mismatch; its id, key and payload never change.
 * - A take scans idem_outbox_due (topic, not_before, id) with a fresh MVCC
 *   snapshot, so it never sees an uncommitted enqueue, and locks each
 *   candidate with LockWaitSkip: a message that another transaction holds
 *   (a take, a finish, an operator) is skipped, never waited for, and a
 *   message changed since the snapshot is skipped too.  The locked version
 *   is the newest, and it is checked again (state, due time) before it is
 *   leased.  Two takes can therefore never lease one message, and a lease
 *   is the message's row lock until the take commits, then its attempt.
 * - Each take raises attempt by one: the fencing token.  Finishing
 *   (delivered, retry, dead) locks the newest version by id, waiting for a
 *   transaction that holds it, and accepts only the attempt of the newest
 *   take; after another take that attempt is stale whatever the clock
 *   says, so a dispatcher that wakes up late cannot finish a later lease.
 * - An ordering key: a message is due only when no earlier message (a
 *   smaller id, so enqueued earlier) of its tenant, topic and ordering key
 *   is queued, leased or unknown.  That is asked of idem_outbox_order with
 *   a dirty snapshot, so an earlier message still being enqueued, or being
 *   leased by another take, holds the later one back too.
 * - A leased message whose lease ran out is due again (not_before is the
 *   lease's end); the take that finds it either leases it again with the
 *   next attempt, or, for redeliver = false, turns it unknown, or, when
 *   the run's attempts are used up, dead.  Readers (idem_message, the
 *   stats view) show such a message as it will be, before a take writes
 *   it.
 *
 * Committing a transaction that enqueued (or requeued) a message notifies
 * channel idem_outbox with the topic; PostgreSQL sends one notification
 * per channel and payload and transaction.
 *
 * How long a finished message is kept is fixed by its enqueue, under the
 * settings of the business transaction that a retry would repeat: an
 * unfinished message's expires_at holds created_at plus that retention,
 * and the finish dates it from finished_at instead.  A dispatcher's own
 * idem.outbox_retention therefore never shortens it (the key purged before
 * the business transaction's retry would enqueue, and send, it again).
 * Only a message that 0.3.0's library enqueued has no expires_at; its
 * finish applies the finishing session's settings, as 0.3.0 did.
 *
 * Delivered and dead messages are deleted by the purge (outbox_purge_batch,
 * through SQL, FOR UPDATE SKIP LOCKED like the records' purge).  On Citus
 * the outbox is a table of the coordinator (idem_distribute() leaves it).
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
#include "commands/async.h"
#include "commands/sequence.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "access.h"
#include "args.h"
#include "decisions.h"
#include "extension.h"
#include "fingerprint.h"
#include "outbox.h"
#include "pause.h"
#include "protocol.h"
#include "settings.h"
#include "subscription.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_take);
PG_FUNCTION_INFO_V1(idem_delivered_many);
PG_FUNCTION_INFO_V1(idem_delivered);
PG_FUNCTION_INFO_V1(idem_retry);
PG_FUNCTION_INFO_V1(idem_dead);
PG_FUNCTION_INFO_V1(idem_requeue);
PG_FUNCTION_INFO_V1(idem_message);

/* The channel that committed enqueues notify, with the topic */
#define OUTBOX_CHANNEL "idem_outbox"

/* The most messages one take may lease */
#define OUTBOX_MAX_TAKE 10000

/* idem_outbox's columns, found by name when the table is looked up */
#define OUTBOX_COLUMNS(X) \
	X(O_ID, id) X(O_TENANT, tenant) X(O_TOPIC, topic) X(O_KEY, key) \
	X(O_STATE, state) X(O_PAYLOAD, payload) X(O_HEADERS, headers) \
	X(O_ORDERING_KEY, ordering_key) X(O_REDELIVER, redeliver) \
	X(O_MAX_ATTEMPTS, max_attempts) X(O_ATTEMPT, attempt) \
	X(O_ATTEMPT_BASE, attempt_base) X(O_NOT_BEFORE, not_before) \
	X(O_LEASE_EXPIRES_AT, lease_expires_at) X(O_LAST_ERROR, last_error) \
	X(O_STATUS, status) X(O_BODY, body) X(O_CREATED_AT, created_at) \
	X(O_FINISHED_AT, finished_at) X(O_EXPIRES_AT, expires_at)

IDEM_NAMED_ENUM(OutboxColumn, OUTBOX_COLUMNS, NUM_OUTBOX_COLUMNS, column_names);

/* A message's state, as stored in idem_outbox.state */
#define MESSAGE_STATES(X) \
	X(MSG_QUEUED, queued) X(MSG_LEASED, leased) X(MSG_DELIVERED, delivered) \
	X(MSG_DEAD, dead) X(MSG_UNKNOWN, unknown)

IDEM_NAMED_ENUM(MessageState, MESSAGE_STATES, NUM_MESSAGE_STATES, state_names);

/* The indexes of idem_outbox that calls read, as the install script makes them */
typedef enum OutboxIndex
{
	I_PKEY,
	I_KEY,
	I_DUE,
	I_ORDER,
	NUM_OUTBOX_INDEXES
} OutboxIndex;

static const AccessIndex index_shapes[NUM_OUTBOX_INDEXES] = {
	[I_PKEY] = {"idem_outbox_pkey", true, {"id"}},
	[I_KEY] = {"idem_outbox_key", true, {"tenant", "topic", "key"}},
	[I_DUE] = {"idem_outbox_due", false, {"topic", "not_before", "id"},
	"(state = ANY (ARRAY['queued'::text, 'leased'::text]))"},
	[I_ORDER] = {"idem_outbox_order", false,
		{"tenant", "topic", "ordering_key", "id"},
	"((ordering_key IS NOT NULL) AND (state = ANY (ARRAY['queued'::text, 'leased'::text, 'unknown'::text])))"},
};


/* What the look-up of idem_outbox finds with it (look_up_rest) */
typedef struct OutboxTables
{
	Oid			seq;
	Oid			index[NUM_OUTBOX_INDEXES];
	AttrNumber	trace;			/* 0.4.0's column, or InvalidAttrNumber */
} OutboxTables;

static OutboxTables tables;

static void look_up_rest(AccessTable *t, Oid schema);

static AccessTable outbox_table =
	ACCESS_TABLE("idem_outbox", column_names, look_up_rest);

/* One call's access to the table, from outbox_open() to outbox_close() */
typedef struct Outbox
{
	Oid			caller_userid;
	int			caller_sec_context;
	MemoryContext caller;		/* values read are copied here */
	Relation	rel;
	Relation	index[NUM_OUTBOX_INDEXES];
	TupleTableSlot *slot;
	EState	   *estate;
	ResultRelInfo *rri;
	List	   *arbiters;
	TimestampTz now;
} Outbox;

/* A message as read from the table: what the decisions need */
typedef struct Message
{
	ItemPointerData tid;
	int64		id;
	text	   *tenant;
	text	   *topic;
	MessageState state;
	bool		redeliver;
	int32		max_attempts;
	int32		attempt;
	int32		attempt_base;
	TimestampTz not_before;
	TimestampTz lease_expires_at;	/* DT_NOBEGIN when none */
	TimestampTz created_at;
	bool		has_ordering_key;
	bool		finished;		/* finished_at is set */
	int64		retention;		/* microseconds kept once finished; -1 if
								 * not fixed at its enqueue */
} Message;

/*
 * Find, with idem_outbox, its sequence and its indexes.  Like idem_record,
 * the table must be a heap: the take reads heap tuples.
 */
static void
look_up_rest(AccessTable *t, Oid schema)
{
	access_require_heap(t->relid);
	access_refuse_write_triggers(t->relid);
	tables.seq = get_relname_relid("idem_outbox_id_seq", schema);
	if (!OidIsValid(tables.seq))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("sequence \"idem_outbox_id_seq\" of extension \"idem\" does not exist in this database")));
	for (int i = 0; i < NUM_OUTBOX_INDEXES; i++)
		tables.index[i] = access_index_of(&index_shapes[i], schema, t->relid);
	tables.trace = access_optional_column(t->relid, "trace", TEXTOID);
}

/* idem_outbox's OID, for subscription.c */
Oid
outbox_relation(void)
{
	return access_relation(&outbox_table);
}

/*
 * Open the table for one call, as its owner (the API functions run as
 * their caller, so that the tenant binding sees who calls; direct access
 * checks no privileges, and an error in between restores the caller's
 * user with the transaction's abort).  A write takes RowExclusiveLock and
 * sets up what maintaining the indexes needs; the clock is read after the
 * locks, so that a call dates what it writes after any wait for them.
 */
static void
outbox_open(Outbox *ob, bool write)
{
	memset(ob, 0, sizeof(*ob));
	(void) access_relation(&outbox_table);
	ob->caller = CurrentMemoryContext;
	GetUserIdAndSecContext(&ob->caller_userid, &ob->caller_sec_context);
	SetUserIdAndSecContext(outbox_table.owner,
						   ob->caller_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	ob->rel = access_open(&outbox_table, false,
						  write ? RowExclusiveLock : AccessShareLock);
	for (int i = 0; i < NUM_OUTBOX_INDEXES; i++)
		ob->index[i] = index_open(tables.index[i], AccessShareLock);
	ob->slot = table_slot_create(ob->rel, NULL);
	if (write)
	{
		ob->estate = CreateExecutorState();
		ob->rri = makeNode(ResultRelInfo);
		InitResultRelInfo(ob->rri, ob->rel, 0, NULL, 0);
		ExecOpenIndices(ob->rri, true);
		ob->arbiters = access_arbiters(ob->rri, &outbox_table.attnum[O_TENANT], 3);
	}
	ob->now = GetCurrentTimestamp();
}

static void
outbox_close(Outbox *ob)
{
	if (ob->estate != NULL)
	{
		ExecCloseIndices(ob->rri);
		FreeExecutorState(ob->estate);
	}
	ExecDropSingleTupleTableSlot(ob->slot);
	for (int i = 0; i < NUM_OUTBOX_INDEXES; i++)
		index_close(ob->index[i], NoLock);
	table_close(ob->rel, NoLock);
	SetUserIdAndSecContext(ob->caller_userid, ob->caller_sec_context);
}

/* Decisions are made on the primary, and not on a subscriber of the table */
static void
require_outbox_primary(const char *function)
{
	require_primary_for(function, outbox_relation(), "idem_outbox");
}

#define COLUMN(ob, c, isnull) slot_getattr((ob)->slot, outbox_table.attnum[c], (isnull))

static MessageState
state_of(const char *name)
{
	for (int s = 0; s < NUM_MESSAGE_STATES; s++)
		if (strcmp(name, state_names[s]) == 0)
			return (MessageState) s;
	elog(ERROR, "idem_outbox has an unknown state \"%s\"", name);
	pg_unreachable();
}

/* Read the message in the slot; text values are copied to the caller */
static void
deform_message(Outbox *ob, Message *m)
{
	bool		isnull;
	Datum		d;
	MemoryContext old;

	m->tid = ob->slot->tts_tid;
	m->id = DatumGetInt64(COLUMN(ob, O_ID, &isnull));
	m->state = state_of(TextDatumGetCString(COLUMN(ob, O_STATE, &isnull)));
	m->redeliver = DatumGetBool(COLUMN(ob, O_REDELIVER, &isnull));
	m->max_attempts = DatumGetInt32(COLUMN(ob, O_MAX_ATTEMPTS, &isnull));
	m->attempt = DatumGetInt32(COLUMN(ob, O_ATTEMPT, &isnull));
	m->attempt_base = DatumGetInt32(COLUMN(ob, O_ATTEMPT_BASE, &isnull));
	m->not_before = DatumGetTimestampTz(COLUMN(ob, O_NOT_BEFORE, &isnull));
	d = COLUMN(ob, O_LEASE_EXPIRES_AT, &isnull);
	m->lease_expires_at = isnull ? DT_NOBEGIN : DatumGetTimestampTz(d);
	m->created_at = DatumGetTimestampTz(COLUMN(ob, O_CREATED_AT, &isnull));
	(void) COLUMN(ob, O_ORDERING_KEY, &isnull);
	m->has_ordering_key = !isnull;
	d = COLUMN(ob, O_FINISHED_AT, &isnull);
	m->finished = !isnull;
	m->retention = -1;
	if (!m->finished)
		d = TimestampTzGetDatum(m->created_at);
	{
		TimestampTz since = DatumGetTimestampTz(d);

		d = COLUMN(ob, O_EXPIRES_AT, &isnull);
		if (!isnull)
			m->retention = DatumGetTimestampTz(d) - since;
	}
	old = MemoryContextSwitchTo(ob->caller);
	m->tenant = DatumGetTextPCopy(COLUMN(ob, O_TENANT, &isnull));
	m->topic = DatumGetTextPCopy(COLUMN(ob, O_TOPIC, &isnull));
	MemoryContextSwitchTo(old);
}

/*
 * The log line of a decision (enqueue, take, delivered, retry, dead) over
 * message id, whose row the slot holds (decisions.c): its outcome (for a
 * finish, the state it left) and attempt; conflict tells whether
 * idem.log_outcomes = conflicts logs it too
 */
static void
log_message(Outbox *ob, const char *decision, bool conflict,
			const char *outcome, int64 id, int32 attempt)
{
	IdemKey		key;
	bool		isnull;

	if (!decisions_logged(conflict))
		return;
	key.tenant = DatumGetTextPP(COLUMN(ob, O_TENANT, &isnull));
	key.endpoint = DatumGetTextPP(COLUMN(ob, O_TOPIC, &isnull));
	key.key = DatumGetTextPP(COLUMN(ob, O_KEY, &isnull));
	decisions_log(decision, &key, "topic", "outcome=%s id=%lld attempt=%d",
				  outcome, (long long) id, attempt);
}

/*
 * The state a message is in, as the next take will write it: a lease that
 * ran out leaves a message that may not be redelivered unknown, one whose
 * run of attempts is used up dead, and any other queued (due again).
 * Readers are shown this state, and finishing calls decide over it.
 */
static MessageState
shown_state(const Message *m, TimestampTz now)
{
	if (m->state != MSG_LEASED || m->lease_expires_at > now)
		return m->state;
	if (!m->redeliver)
		return MSG_UNKNOWN;
	if (m->attempt - m->attempt_base >= m->max_attempts)
		return MSG_DEAD;
	return MSG_QUEUED;
}

/* Equality of a text column, in "C" */
static void
text_key(ScanKey skey, AttrNumber attno, const text *value)
{
	ScanKeyEntryInitialize(skey, 0, attno, BTEqualStrategyNumber, InvalidOid,
						   C_COLLATION_OID, F_TEXTEQ, PointerGetDatum(value));
}

static inline void
set_column(Datum *values, bool *nulls, OutboxColumn c, Datum value,
		   bool isnull)
{
	access_set_column(&outbox_table, values, nulls, c, value, isnull);
}

/* Put a row into the slot, its constraints applied */
static void
store_row(Outbox *ob, Datum *values, bool *nulls)
{
	access_store_row(&outbox_table.checks, ob->rel, ob->slot, values, nulls);
}

/* Replace the version at tid (locked by this transaction) with values */
static void
update_row(Outbox *ob, ItemPointer tid, Datum *values, bool *nulls)
{
	access_update_row(&outbox_table.checks, ob->rel, ob->rri, ob->estate, ob->slot, tid,
					  values, nulls);
}

/*
 * The key's message as another transaction leaves it: after waiting for a
 * transaction that is inserting or deleting it, false if there is none,
 * else true with it in the slot.  A version that another transaction is
 * updating is no reason to wait: its id, key and payload stay.
 */
static bool
probe_key(Outbox *ob, const IdemKey *key)
{
	ScanKeyData skeys[3];
	SnapshotData dirty;

	text_key(&skeys[0], 1, key->tenant);
	text_key(&skeys[1], 2, key->endpoint);
	text_key(&skeys[2], 3, key->key);
	InitDirtySnapshot(dirty);
	for (;;)
	{
		IndexScanDesc scan;
		HeapTuple	tuple;
		ItemPointerData tid;
		bool		inserting;
		bool		deleting;

		scan = idem_index_beginscan(ob->rel, ob->index[I_KEY], &dirty, 3);
		index_rescan(scan, skeys, 3, NULL, 0);
		if (!index_getnext_slot(scan, ForwardScanDirection, ob->slot))
		{
			index_endscan(scan);
			return false;
		}
		index_endscan(scan);
		tuple = ExecFetchSlotHeapTuple(ob->slot, false, NULL);
		tid = ob->slot->tts_tid;
		inserting = TransactionIdIsValid(dirty.xmin) &&
			!(tuple->t_data->t_infomask & HEAP_UPDATED);
		deleting = TransactionIdIsValid(dirty.xmax) &&
			ItemPointerEquals(&tuple->t_self, &tuple->t_data->t_ctid);
		if (!inserting && !deleting)
			return true;
		if (inserting && dirty.speculativeToken != 0)
			SpeculativeInsertionWait(dirty.xmin, dirty.speculativeToken);
		else
			XactLockTableWait(inserting ? dirty.xmin : dirty.xmax, ob->rel,
							  &tid, XLTW_InsertIndex);
	}
}

/* The outcome of an enqueue, and the message it names */
typedef struct Enqueued
{
	const char *outcome;
	int64		id;
	MessageState state;
	TimestampTz created_at;
} Enqueued;

/* What an enqueue asks for */
typedef struct NewMessage
{
	IdemKey		key;			/* endpoint is the topic */
	bytea	   *payload;
	Jsonb	   *headers;
	TimestampTz not_before;
	text	   *ordering_key;
	int32		max_attempts;
	bool		redeliver;
} NewMessage;

/*
 * idem.outbox_retention, checked where it is fixed (an enqueue, and the
 * finish of a message 0.3.0's library enqueued): over the DBA's cap
 * idem.max_retention it errors, and it must outlive the callers' retry
 * window, or a business transaction retried after its message was purged
 * would enqueue it, and send it, again.
 */
static void
check_outbox_retention(void)
{
	if (idem_outbox_retention <= idem_retry_window)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem.outbox_retention (%ds) must be longer than idem.retry_window (%ds)",
						idem_outbox_retention, idem_retry_window),
				 errdetail("A business transaction retried after its message was purged would send it again.")));
	protocol_check_cap("enqueue", "retention", 0,
					   (TimestampTz) idem_outbox_retention * USECS_PER_SEC,
					   (int64) idem_max_retention * USECS_PER_SEC, NULL,
					   "idem.outbox_retention", "idem.max_retention");
}

/* When a message finished (or, at its enqueue, created) at now is purged */
static TimestampTz
expiry(TimestampTz now)
{
	check_outbox_retention();
	return now + (TimestampTz) idem_outbox_retention * USECS_PER_SEC;
}

/* Whether the version in slot was written by this transaction */
static bool
own_version(TupleTableSlot *slot)
{
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, NULL);

	return TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
}

/*
 * Find the version of key's message that snapshot shows, into the slot;
 * false if it shows none
 */
static bool
find_key(Outbox *ob, const IdemKey *key, Snapshot snapshot)
{
	ScanKeyData skeys[3];
	IndexScanDesc scan;
	bool		found;

	text_key(&skeys[0], 1, key->tenant);
	text_key(&skeys[1], 2, key->endpoint);
	text_key(&skeys[2], 3, key->key);
	scan = idem_index_beginscan(ob->rel, ob->index[I_KEY], snapshot, 3);
	index_rescan(scan, skeys, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, ob->slot);
	index_endscan(scan);
	return found;
}

/*
 * Insert the message unless its key exists.  The speculative insertion
 * comes first: most keys are new, and a duplicate costs a killed tuple.
 */
static void
enqueue(Outbox *ob, const NewMessage *nm, Enqueued *out)
{
	int			natts = RelationGetDescr(ob->rel)->natts;
	Datum	   *values = palloc0(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));
	TimestampTz not_before = nm->not_before == DT_NOBEGIN ? ob->now : nm->not_before;

	memset(nulls, true, natts * sizeof(bool));
	set_column(values, nulls, O_TENANT, PointerGetDatum(nm->key.tenant), false);
	set_column(values, nulls, O_TOPIC, PointerGetDatum(nm->key.endpoint), false);
	set_column(values, nulls, O_KEY, PointerGetDatum(nm->key.key), false);
	set_column(values, nulls, O_STATE,
			   CStringGetTextDatum(state_names[MSG_QUEUED]), false);
	set_column(values, nulls, O_PAYLOAD, PointerGetDatum(nm->payload), false);
	if (nm->headers != NULL)
		set_column(values, nulls, O_HEADERS, PointerGetDatum(nm->headers),
				   false);
	if (nm->ordering_key != NULL)
		set_column(values, nulls, O_ORDERING_KEY,
				   PointerGetDatum(nm->ordering_key), false);
	set_column(values, nulls, O_REDELIVER, BoolGetDatum(nm->redeliver), false);
	set_column(values, nulls, O_MAX_ATTEMPTS, Int32GetDatum(nm->max_attempts),
			   false);
	set_column(values, nulls, O_ATTEMPT, Int32GetDatum(0), false);
	set_column(values, nulls, O_ATTEMPT_BASE, Int32GetDatum(0), false);
	set_column(values, nulls, O_NOT_BEFORE, TimestampTzGetDatum(not_before),
			   false);
	set_column(values, nulls, O_CREATED_AT, TimestampTzGetDatum(ob->now),
			   false);
	set_column(values, nulls, O_EXPIRES_AT,
			   TimestampTzGetDatum(expiry(ob->now)), false);
	/* the enqueue's idem.trace, as a claim that executes stores it */
	if (tables.trace != InvalidAttrNumber && idem_trace != NULL &&
		idem_trace[0] != '\0')
	{
		values[tables.trace - 1] = CStringGetTextDatum(idem_trace);
		nulls[tables.trace - 1] = false;
	}

	for (;;)
	{
		int64		id = nextval_internal(tables.seq, false);
		bool		isnull;
		bytea	   *stored;

		set_column(values, nulls, O_ID, Int64GetDatum(id), false);
		store_row(ob, values, nulls);
		if (access_insert_speculative(ob->rri, ob->estate, ob->slot,
									  ob->arbiters))
		{
			CommandCounterIncrement();
			out->outcome = "enqueued";
			out->id = id;
			out->state = MSG_QUEUED;
			out->created_at = ob->now;
			log_message(ob, "enqueue", false, out->outcome, id, 0);
			Async_Notify(OUTBOX_CHANNEL, text_to_cstring(nm->key.endpoint));
			return;
		}
		if (!probe_key(ob, &nm->key))
			continue;

		/*
		 * Under REPEATABLE READ or SERIALIZABLE the snapshot may not show
		 * the message that holds the key: answering duplicate would say
		 * what the transaction cannot see, so it fails as an INSERT into a
		 * unique index that another transaction filled meanwhile does.  A
		 * message whose newest version it cannot see (a take since) it may
		 * see in an older one: then the answer is that version's.  A
		 * message this transaction wrote, even in this very statement (a
		 * key repeated in one idem_enqueue_many), is its own to answer.
		 */
		if (IsolationUsesXactSnapshot() && !own_version(ob->slot) &&
			!table_tuple_satisfies_snapshot(ob->rel, ob->slot,
											GetActiveSnapshot()) &&
			!find_key(ob, &nm->key, GetActiveSnapshot()))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent enqueue of idem key \"%s\" of topic \"%s\"",
							text_to_cstring(nm->key.key),
							text_to_cstring(nm->key.endpoint)),
					 errhint("Retry the transaction.")));

		stored = DatumGetByteaPP(COLUMN(ob, O_PAYLOAD, &isnull));
		out->outcome =
			VARSIZE_ANY_EXHDR(stored) == VARSIZE_ANY_EXHDR(nm->payload) &&
			memcmp(VARDATA_ANY(stored), VARDATA_ANY(nm->payload),
				   VARSIZE_ANY_EXHDR(stored)) == 0 ? "duplicate" : "mismatch";
		{
			Message		m;

			deform_message(ob, &m);
			out->id = m.id;
			out->state = shown_state(&m, ob->now);
			out->created_at = m.created_at;
			log_message(ob, "enqueue", strcmp(out->outcome, "mismatch") == 0,
						out->outcome, m.id, m.attempt);
		}
		return;
	}
}

/*
 * Whether an earlier message of m's ordering key (same tenant and topic,
 * smaller id) is queued, leased or unknown, or is being written by another
 * transaction: then m is not due.  The slot is reused.
 */
static bool
held_back(Outbox *ob, const Message *m)
{
	ScanKeyData skeys[4];
	SnapshotData dirty;
	IndexScanDesc scan;
	bool		isnull;
	Datum		ordering_key;
	bool		found;

	ordering_key = datumCopy(COLUMN(ob, O_ORDERING_KEY, &isnull), false, -1);
	text_key(&skeys[0], 1, m->tenant);
	text_key(&skeys[1], 2, m->topic);
	text_key(&skeys[2], 3, (text *) DatumGetPointer(ordering_key));
	ScanKeyEntryInitialize(&skeys[3], 0, 4, BTLessStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8LT, Int64GetDatum(m->id));
	InitDirtySnapshot(dirty);
	scan = idem_index_beginscan(ob->rel, ob->index[I_ORDER], &dirty, 4);
	index_rescan(scan, skeys, 4, NULL, 0);
	found = false;
	while (!found && index_getnext_slot(scan, ForwardScanDirection, ob->slot))
	{
		MessageState s = state_of(TextDatumGetCString(COLUMN(ob, O_STATE, &isnull)));

		found = s == MSG_QUEUED || s == MSG_LEASED || s == MSG_UNKNOWN ||
			TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax);
	}
	index_endscan(scan);
	return found;
}

/* Write m, locked, as finished in state s (delivered or dead) */
static void
finish_row(Outbox *ob, const Message *m, MessageState s, const char *error,
		   bool has_status, int32 status, bytea *body)
{
	Datum	   *values;
	bool	   *nulls;

	access_copy_row(ob->slot, &values, &nulls);
	set_column(values, nulls, O_STATE, CStringGetTextDatum(state_names[s]),
			   false);
	if (error != NULL)
		set_column(values, nulls, O_LAST_ERROR, CStringGetTextDatum(error),
				   false);
	if (has_status)
		set_column(values, nulls, O_STATUS, Int32GetDatum(status), false);
	if (body != NULL)
		set_column(values, nulls, O_BODY, PointerGetDatum(body), false);
	set_column(values, nulls, O_FINISHED_AT, TimestampTzGetDatum(ob->now),
			   false);
	set_column(values, nulls, O_EXPIRES_AT,
			   TimestampTzGetDatum(m->retention >= 0 ?
								   ob->now + m->retention : expiry(ob->now)),
			   false);
	update_row(ob, (ItemPointer) &m->tid, values, nulls);
}

/*
 * Lease up to max due messages of topic (of tenant only, if not NULL; of
 * no tenant in paused) and put them into the tuplestore.  See the file's header for why two takes
 * never lease one message.
 */
static void
take(Outbox *ob, text *topic, int32 max, TimestampTz lease_expires_at,
	 text *tenant, List *paused, Tuplestorestate *store, TupleDesc desc)
{
	ScanKeyData skeys[2];
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IndexScanDesc scan;
	TupleTableSlot *candidate = table_slot_create(ob->rel, NULL);
	int32		taken = 0;

	text_key(&skeys[0], 1, topic);
	ScanKeyEntryInitialize(&skeys[1], 0, 2, BTLessEqualStrategyNumber,
						   InvalidOid, InvalidOid, F_TIMESTAMPTZ_LE,
						   TimestampTzGetDatum(ob->now));
	scan = idem_index_beginscan(ob->rel, ob->index[I_DUE], snapshot, 2);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (taken < max &&
		   index_getnext_slot(scan, ForwardScanDirection, candidate))
	{
		TM_Result	result;
		ItemPointerData tid = candidate->tts_tid;
		Message		m;
		Datum	   *values;
		bool	   *nulls;
		Datum		row[8];
		bool		rownulls[8] = {false};
		bool		isnull;

		CHECK_FOR_INTERRUPTS();
		if (tenant != NULL || paused != NIL)
		{
			text	   *t = DatumGetTextPP(slot_getattr(candidate,
														outbox_table.attnum[O_TENANT],
														&isnull));

			if (tenant != NULL &&
				(VARSIZE_ANY_EXHDR(t) != VARSIZE_ANY_EXHDR(tenant) ||
				 memcmp(VARDATA_ANY(t), VARDATA_ANY(tenant),
						VARSIZE_ANY_EXHDR(t)) != 0))
				continue;
			if (pause_holds(paused, t))
				continue;
		}
		/*
		 * A message this transaction enqueued may still roll back: a take
		 * in the same transaction leaves it (the dispatcher calls out after
		 * its take commits, and the enqueue commits no earlier)
		 */
		{
			HeapTuple	tuple = ExecFetchSlotHeapTuple(candidate, false, NULL);

			if (!(tuple->t_data->t_infomask & HEAP_UPDATED) &&
				TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)))
				continue;
		}
		result = access_lock_row(ob->rel, &tid, snapshot, ob->slot,
								 LockWaitSkip, false, "outbox message");
		if (result != TM_Ok)
			continue;			/* held or changed by another transaction */
		deform_message(ob, &m);
		if ((m.state != MSG_QUEUED && m.state != MSG_LEASED) ||
			m.not_before > ob->now)
			continue;
		if (m.state == MSG_LEASED)
		{
			/* its lease ran out: write what readers were shown */
			MessageState s = shown_state(&m, ob->now);

			if (s == MSG_UNKNOWN)
			{
				access_copy_row(ob->slot, &values, &nulls);
				set_column(values, nulls, O_STATE,
						   CStringGetTextDatum(state_names[MSG_UNKNOWN]), false);
				update_row(ob, &m.tid, values, nulls);
				log_message(ob, "take", true, state_names[MSG_UNKNOWN], m.id,
							m.attempt);
				continue;
			}
			if (s == MSG_DEAD)
			{
				finish_row(ob, &m, MSG_DEAD, "the last attempt's lease ran out",
						   false, 0, NULL);
				log_message(ob, "take", false, state_names[MSG_DEAD], m.id,
							m.attempt);
				continue;
			}
		}
		if (m.has_ordering_key)
		{
			bool		held;

			/* held_back reuses the slot: read the row again afterwards */
			held = held_back(ob, &m);
			if (held)
				continue;
			if (!table_tuple_fetch_row_version(ob->rel, &m.tid, SnapshotAny,
											   ob->slot))
				elog(ERROR, "could not read back a locked message");
		}

		access_copy_row(ob->slot, &values, &nulls);
		set_column(values, nulls, O_STATE,
				   CStringGetTextDatum(state_names[MSG_LEASED]), false);
		set_column(values, nulls, O_ATTEMPT, Int32GetDatum(m.attempt + 1),
				   false);
		set_column(values, nulls, O_LEASE_EXPIRES_AT,
				   TimestampTzGetDatum(lease_expires_at), false);
		set_column(values, nulls, O_NOT_BEFORE,
				   TimestampTzGetDatum(lease_expires_at), false);
		row[0] = Int64GetDatum(m.id);
		row[1] = PointerGetDatum(m.tenant);
		row[2] = PointerGetDatum(m.topic);
		row[3] = values[outbox_table.attnum[O_KEY] - 1];
		row[4] = values[outbox_table.attnum[O_PAYLOAD] - 1];
		row[5] = values[outbox_table.attnum[O_HEADERS] - 1];
		rownulls[5] = nulls[outbox_table.attnum[O_HEADERS] - 1];
		row[6] = Int32GetDatum(m.attempt + 1);
		row[7] = TimestampTzGetDatum(lease_expires_at);
		/* the tuplestore copies the row before the update reuses the slot */
		tuplestore_putvalues(store, desc, row, rownulls);
		log_message(ob, "take", false, state_names[MSG_LEASED], m.id,
					m.attempt + 1);
		update_row(ob, &m.tid, values, nulls);
		taken++;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(candidate);
	UnregisterSnapshot(snapshot);
}

/*
 * Find message id and lock its newest version, waiting for a transaction
 * that holds it (finishing a message is an update, and waits as one);
 * false if there is no such message.  The binding is checked before
 * anything else is said about the message.
 */
static bool
lock_by_id(Outbox *ob, int64 id, Message *m)
{
	ScanKeyData skey;

	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8EQ, Int64GetDatum(id));
	for (;;)
	{
		Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
		IndexScanDesc scan;
		TM_Result	result;
		ItemPointerData tid;
		bool		found;

		scan = idem_index_beginscan(ob->rel, ob->index[I_PKEY], snapshot, 1);
		index_rescan(scan, &skey, 1, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, ob->slot);
		index_endscan(scan);
		if (!found)
		{
			UnregisterSnapshot(snapshot);
			return false;
		}
		tid = ob->slot->tts_tid;
		result = access_lock_row(ob->rel, &tid, snapshot, ob->slot,
								 LockWaitBlock, true,
								 psprintf("outbox message %lld", (long long) id));
		UnregisterSnapshot(snapshot);
		if (result == TM_Deleted)
			continue;			/* purged meanwhile: look again */
		if (result != TM_Ok)
			elog(ERROR, "unexpected table_tuple_lock status: %u", result);
		deform_message(ob, m);
		/* the binding is the caller's, not the table owner's */
		SetUserIdAndSecContext(ob->caller_userid, ob->caller_sec_context);
		tenant_check(m->tenant);
		SetUserIdAndSecContext(outbox_table.owner,
							   ob->caller_sec_context | SECURITY_LOCAL_USERID_CHANGE);
		/* the wait may have been long: date what is written after it */
		ob->now = GetCurrentTimestamp();
		return true;
	}
}

pg_noreturn static void report_stale(const char *function, const Message *m,
									 MessageState s, int32 attempt);

/*
 * The one place that refuses an answer for an attempt that is not live: not
 * the newest take's, or one whose lease ran out (s is the state that
 * leaves the message in)
 */
static void
report_stale(const char *function, const Message *m, MessageState s,
			 int32 attempt)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s: attempt %d of outbox message %lld is not its live lease",
					function, attempt, (long long) m->id),
			 m->state == MSG_LEASED && s != MSG_LEASED ?
			 errdetail("The lease of attempt %d ran out; the message is %s.",
					   m->attempt, state_names[s]) :
			 errdetail("The message is %s at attempt %d.",
					   state_names[s], m->attempt)));
}

pg_noreturn static void report_no_message(const char *function, int64 id);

static void
report_no_message(const char *function, int64 id)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s: outbox message %lld does not exist", function,
					(long long) id)));
}

/*
 * The backoff before the next attempt of a message whose n-th attempt of
 * its run failed: idem.outbox_backoff doubled for each earlier failure, at
 * most idem.outbox_backoff_max, and then between half of that and all of
 * it ("equal jitter"), so that messages that failed together are not all
 * due again at once.
 */
static TimestampTz
backoff_until(TimestampTz now, int32 n)
{
	double		ms = (double) idem_outbox_backoff;

	for (int32 i = 1; i < n && ms < (double) idem_outbox_backoff_max; i++)
		ms *= 2;
	ms = Min(ms, (double) idem_outbox_backoff_max);
	ms = ms / 2 + pg_prng_double(&pg_global_prng_state) * ms / 2;
	return now + (TimestampTz) (ms * 1000);
}

/* What finishing a lease does */
typedef enum FinishHow
{
	FINISH_DELIVERED,
	FINISH_RETRY,
	FINISH_DEAD
} FinishHow;

/*
 * Finish attempt of message id; the state it is left in.  delivered
 * accepts the newest take of a leased message, or of an unknown one (an
 * operator who checked the receiver); retry and dead only that of a
 * leased one.  In a batch (idem_delivered_many), the batch's Outbox is
 * passed, opened once for all its elements; otherwise a call of its own.
 */
static MessageState
finish(Outbox *batch, const char *function, int64 id, int32 attempt,
	   FinishHow how, const char *error, bool has_status, int32 status,
	   bytea *body, Interval *after)
{
	Outbox		own;
	Outbox	   *ob = batch;
	Message		m;
	MessageState result;
	MessageState s;
	Datum	   *values;
	bool	   *nulls;

	if (ob == NULL)
	{
		require_outbox_primary(function);
		outbox_open(&own, true);
		ob = &own;
	}
	else
		ob->caller = CurrentMemoryContext;	/* the element's memory */
	if (!lock_by_id(ob, id, &m))
		report_no_message(function, id);
	s = shown_state(&m, ob->now);
	if (m.attempt != attempt || m.attempt == 0 ||
		!(s == MSG_LEASED || (how == FINISH_DELIVERED && s == MSG_UNKNOWN)))
		report_stale(function, &m, s, attempt);

	switch (how)
	{
		case FINISH_DELIVERED:
			finish_row(ob, &m, MSG_DELIVERED, NULL, has_status, status, body);
			result = MSG_DELIVERED;
			break;
		case FINISH_DEAD:
			finish_row(ob, &m, MSG_DEAD, error, false, 0, NULL);
			result = MSG_DEAD;
			break;
		case FINISH_RETRY:
			if (m.attempt - m.attempt_base >= m.max_attempts)
			{
				finish_row(ob, &m, MSG_DEAD, error, false, 0, NULL);
				result = MSG_DEAD;
				break;
			}
			access_copy_row(ob->slot, &values, &nulls);
			set_column(values, nulls, O_STATE,
					   CStringGetTextDatum(state_names[MSG_QUEUED]), false);
			set_column(values, nulls, O_LAST_ERROR,
					   error ? CStringGetTextDatum(error) : (Datum) 0,
					   error == NULL);
			set_column(values, nulls, O_NOT_BEFORE,
					   TimestampTzGetDatum(after != NULL ?
										   protocol_time_plus(ob->now, after, "after") :
										   backoff_until(ob->now, m.attempt - m.attempt_base)),
					   false);
			update_row(ob, &m.tid, values, nulls);
			result = MSG_QUEUED;
			break;
	}
	log_message(ob, how == FINISH_DELIVERED ? "delivered" :
				how == FINISH_RETRY ? "retry" : "dead", false,
				state_names[result], m.id, m.attempt);
	if (batch == NULL)
		outbox_close(ob);
	return result;
}

/* ---- The SQL-callable functions ---- */

static int64
id_from_arg(FunctionCallInfo fcinfo, int argno)
{
	require_not_null(fcinfo, argno, "id");
	return PG_GETARG_INT64(argno);
}

static int32
lease_attempt_from_arg(FunctionCallInfo fcinfo, int argno)
{
	require_not_null(fcinfo, argno, "attempt");
	return check_attempt(PG_GETARG_INT32(argno));
}

/* A delivery's error, bounded by idem.max_body_size like the answers */
static char *
error_from_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	check_body_size("error", (bytea *) PG_GETARG_TEXT_PP(argno));
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/*
 * idem_enqueue(tenant, topic, key, payload, headers, not_before,
 * ordering_key, max_attempts, redeliver): in the caller's transaction
 */
static Datum
enqueue_call(FunctionCallInfo fcinfo, bool jsonb)
{
	NewMessage	nm;
	Enqueued	out;
	Outbox		ob;
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {false};

	nm.key.tenant = key_part_from_arg(fcinfo, 0, "tenant");
	nm.key.endpoint = key_part_from_arg(fcinfo, 1, "topic");
	nm.key.key = key_part_from_arg(fcinfo, 2, "key");
	require_not_null(fcinfo, 3, "payload");
	nm.payload = jsonb ? jsonb_body(PG_GETARG_DATUM(3)) : PG_GETARG_BYTEA_PP(3);
	check_body_size("payload", nm.payload);
	nm.headers = PG_ARGISNULL(4) ? NULL : check_headers(PG_GETARG_JSONB_P(4));
	nm.not_before = PG_ARGISNULL(5) ? DT_NOBEGIN : PG_GETARG_TIMESTAMPTZ(5);
	if (!PG_ARGISNULL(5) && TIMESTAMP_NOT_FINITE(nm.not_before))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("not_before must be a finite time")));
	nm.ordering_key = PG_ARGISNULL(6) ? NULL :
		check_key_part(PG_GETARG_TEXT_PP(6), "ordering_key");
	nm.max_attempts = PG_ARGISNULL(7) ? idem_outbox_max_attempts : PG_GETARG_INT32(7);
	if (nm.max_attempts < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1"),
				 errdetail("The max_attempts given was %d.", nm.max_attempts)));
	nm.redeliver = bool_from_arg(fcinfo, 8, "redeliver");
	tenant_check(nm.key.tenant);
	require_outbox_primary("idem_enqueue()");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE ||
		desc->natts != 4)
		elog(ERROR, "incorrect number of output arguments");

	outbox_open(&ob, true);
	enqueue(&ob, &nm, &out);
	outbox_close(&ob);

	values[0] = CStringGetTextDatum(out.outcome);
	values[1] = Int64GetDatum(out.id);
	values[2] = CStringGetTextDatum(state_names[out.state]);
	values[3] = TimestampTzGetDatum(out.created_at);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc),
													  values, nulls)));
}

IDEM_SQL_FUNCTION(idem_enqueue, enqueue_call, false);
IDEM_SQL_FUNCTION(idem_enqueue_jsonb, enqueue_call, true);

/*
 * idem_enqueue_many(tenant, topic, keys, payloads, headers): one enqueue per
 * element, with the defaults of idem_enqueue's other arguments, in one
 * opening of the table; a row per element as idem_enqueue answers it,
 * beginning with the key.  Every element is checked before the first is
 * written, so bad input anywhere writes nothing.
 */
static Datum
enqueue_many_call(FunctionCallInfo fcinfo, bool jsonb)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *tenant = key_part_from_arg(fcinfo, 0, "tenant");
	text	   *topic = key_part_from_arg(fcinfo, 1, "topic");
	int			nkeys;
	int			npayloads;
	int			nheaders;
	ArrayType  *keys = array_from_arg(fcinfo, 2, "keys", false, false, &nkeys);
	ArrayType  *payloads = array_from_arg(fcinfo, 3, "payloads", false, false,
										  &npayloads);
	ArrayType  *headers = array_from_arg(fcinfo, 4, "headers", true, true,
										 &nheaders);
	NewMessage *nm;
	ArgsBatch	b;
	ArrayIterator kit;
	ArrayIterator pit;
	ArrayIterator hit;
	Outbox		ob;

	require_length(payloads, "payloads", npayloads, nkeys);
	require_length(headers, "headers", nheaders, nkeys);
	tenant_check(tenant);
	require_outbox_primary("idem_enqueue_many()");
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 5)
		elog(ERROR, "incorrect number of output arguments");

	/* check every element first */
	args_batch_start(&b, "idem_enqueue_many()");
	nm = palloc0(sizeof(NewMessage) * Max(nkeys, 1));
	kit = walk(keys);
	pit = walk(payloads);
	hit = walk(headers);
	for (int i = 0; i < nkeys; i++)
	{
		Datum		value;

		b.element = i + 1;
		nm[i].key.tenant = tenant;
		nm[i].key.endpoint = topic;
		(void) next_element(kit, &value);
		nm[i].key.key = check_key_part(DatumGetTextPP(value), "key");
		(void) next_element(pit, &value);
		nm[i].payload = jsonb ? jsonb_body(value) : DatumGetByteaPP(value);
		check_body_size("payload", nm[i].payload);
		nm[i].headers = next_element(hit, &value) ?
			check_headers(DatumGetJsonbP(value)) : NULL;
		nm[i].not_before = DT_NOBEGIN;
		nm[i].max_attempts = idem_outbox_max_attempts;
		nm[i].redeliver = true;
	}
	b.element = 0;

	outbox_open(&ob, true);
	for (int i = 0; i < nkeys; i++)
	{
		Enqueued	out;
		Datum		row[5];
		bool		nulls[5] = {false};

		MemoryContext old = MemoryContextSwitchTo(b.memory);

		b.element = i + 1;
		enqueue(&ob, &nm[i], &out);
		row[0] = PointerGetDatum(nm[i].key.key);
		row[1] = CStringGetTextDatum(out.outcome);
		row[2] = Int64GetDatum(out.id);
		row[3] = CStringGetTextDatum(state_names[out.state]);
		row[4] = TimestampTzGetDatum(out.created_at);
		/* the tuplestore copies the row */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
		MemoryContextSwitchTo(old);
		MemoryContextReset(b.memory);
		ResetPerTupleExprContext(ob.estate);
	}
	outbox_close(&ob);
	args_batch_end(&b);
	return (Datum) 0;
}

IDEM_SQL_FUNCTION(idem_enqueue_many, enqueue_many_call, false);
IDEM_SQL_FUNCTION(idem_enqueue_many_jsonb, enqueue_many_call, true);

/*
 * idem_delivered_many(ids, attempts, statuses, bodies): idem_delivered of
 * each element, in the caller's transaction.  Empty or NULL arrays (a take that
 * found nothing) finish nothing; a stale attempt anywhere errors as
 * idem_delivered does, and the error takes the batch's earlier finishes
 * with it, so nothing of the batch is written.
 */
Datum
idem_delivered_many(PG_FUNCTION_ARGS)
{
	int			nids;
	int			nattempts;
	int			nstatuses;
	ArrayType  *ids = array_from_arg(fcinfo, 0, "ids", true, false, &nids);
	ArrayType  *attempts = array_from_arg(fcinfo, 1, "attempts", true, false,
										  &nattempts);
	ArrayType  *statuses = array_from_arg(fcinfo, 2, "statuses", true, true,
										  &nstatuses);
	int			nbodies = 0;
	ArrayType  *bodies = PG_NARGS() > 3 ?
		array_from_arg(fcinfo, 3, "bodies", true, true, &nbodies) : NULL;
	int64	   *id;
	int32	   *attempt;
	int32	   *status;
	bool	   *has_status;
	bytea	  **body;
	ArrayIterator iit;
	ArrayIterator ait;
	ArrayIterator sit;
	ArrayIterator bit;
	ArgsBatch	b;
	Outbox		ob;

	if (nids == 0 && nattempts == 0)
		PG_RETURN_VOID();
	if (attempts == NULL || nattempts != nids)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempts must have as many elements as ids"),
				 errdetail("ids has %d elements, attempts has %d.",
						   nids, nattempts)));
	require_length(statuses, "statuses", nstatuses, nids);
	require_length(bodies, "bodies", nbodies, nids);

	args_batch_start(&b, "idem_delivered_many()");
	require_outbox_primary("idem_delivered_many()");
	id = palloc(sizeof(int64) * nids);
	attempt = palloc(sizeof(int32) * nids);
	status = palloc0(sizeof(int32) * nids);
	has_status = palloc0(sizeof(bool) * nids);
	body = palloc0(sizeof(bytea *) * nids);
	iit = walk(ids);
	ait = walk(attempts);
	sit = walk(statuses);
	bit = walk(bodies);
	for (int i = 0; i < nids; i++)
	{
		Datum		value;

		b.element = i + 1;
		(void) next_element(iit, &value);
		id[i] = DatumGetInt64(value);
		(void) next_element(ait, &value);
		attempt[i] = check_attempt(DatumGetInt32(value));
		has_status[i] = next_element(sit, &value);
		if (has_status[i])
			status[i] = check_status(DatumGetInt32(value));
		if (next_element(bit, &value))
		{
			body[i] = DatumGetByteaPP(value);
			check_body_size("body", body[i]);
		}
	}
	b.element = 0;
	outbox_open(&ob, true);
	for (int i = 0; i < nids; i++)
	{
		MemoryContext old = MemoryContextSwitchTo(b.memory);

		b.element = i + 1;
		(void) finish(&ob, "idem_delivered_many()", id[i], attempt[i],
					  FINISH_DELIVERED, NULL, has_status[i], status[i], body[i],
					  NULL);
		MemoryContextSwitchTo(old);
		MemoryContextReset(b.memory);
	}
	outbox_close(&ob);
	args_batch_end(&b);
	PG_RETURN_VOID();
}

/*
 * idem_take(topic, max_messages, lease, tenant).  A role that a binding
 * holds takes its own tenant's messages only: tenant => NULL means its
 * tenant, another tenant is refused.
 */
Datum
idem_take(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *topic = key_part_from_arg(fcinfo, 0, "topic");
	int32		max;
	Interval   *lease = PG_ARGISNULL(2) ? NULL : PG_GETARG_INTERVAL_P(2);
	text	   *tenant;
	Outbox		ob;
	TimestampTz lease_expires_at;
	List	   *paused;
	bool		all_paused;

	require_not_null(fcinfo, 1, "max_messages");
	max = PG_GETARG_INT32(1);
	if (max < 1 || max > OUTBOX_MAX_TAKE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_messages %d is out of range", max),
				 errdetail("max_messages must be between 1 and %d.",
						   OUTBOX_MAX_TAKE)));
	if (!PG_ARGISNULL(3))
	{
		tenant = check_key_part(PG_GETARG_TEXT_PP(3), "tenant");
		tenant_check(tenant);
	}
	else
		tenant = tenant_bound();
	require_outbox_primary("idem_take()");

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 8)
		elog(ERROR, "incorrect number of output arguments");
	paused = pause_tenants(topic, &all_paused);
	if (all_paused)
		return (Datum) 0;
	outbox_open(&ob, true);
	lease_expires_at = protocol_lease_end("take", ob.now, lease);
	take(&ob, topic, max, lease_expires_at, tenant, paused, rsinfo->setResult,
		 rsinfo->setDesc);
	outbox_close(&ob);

	/*
	 * The dispatcher calls out once the take commits: that commit must be
	 * durable whatever synchronous_commit says, or a crash could give the
	 * same attempt to a second take (and make an unknown message due again).
	 * Its flush makes every earlier commit durable too, the enqueue's
	 * included.
	 */
	ForceSyncCommit();
	return (Datum) 0;
}

/* idem_delivered(id, attempt, status, body) */
Datum
idem_delivered(PG_FUNCTION_ARGS)
{
	int64		id = id_from_arg(fcinfo, 0);
	int32		attempt = lease_attempt_from_arg(fcinfo, 1);
	bool		has_status = !PG_ARGISNULL(2);
	int32		status = has_status ? check_status(PG_GETARG_INT32(2)) : 0;
	bytea	   *body = PG_ARGISNULL(3) ? NULL : PG_GETARG_BYTEA_PP(3);

	if (body != NULL)
		check_body_size("body", body);
	(void) finish(NULL, "idem_delivered()", id, attempt, FINISH_DELIVERED, NULL,
				  has_status, status, body, NULL);
	PG_RETURN_VOID();
}

/* idem_retry(id, attempt, error, after): the state it left */
Datum
idem_retry(PG_FUNCTION_ARGS)
{
	int64		id = id_from_arg(fcinfo, 0);
	int32		attempt = lease_attempt_from_arg(fcinfo, 1);
	char	   *error = error_from_arg(fcinfo, 2);
	Interval   *after = PG_ARGISNULL(3) ? NULL : PG_GETARG_INTERVAL_P(3);

	if (after != NULL &&
		(!idem_interval_is_finite(after) ||
		 protocol_time_plus(0, after, "after") < 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after %s is not a delay",
						DatumGetCString(DirectFunctionCall1(interval_out,
															PointerGetDatum(after)))),
				 errdetail("A retry's after must be finite and not negative.")));
	PG_RETURN_TEXT_P(cstring_to_text(state_names[finish(NULL, "idem_retry()", id,
														attempt, FINISH_RETRY,
														error, false, 0,
														NULL, after)]));
}

/* idem_dead(id, attempt, error) */
Datum
idem_dead(PG_FUNCTION_ARGS)
{
	int64		id = id_from_arg(fcinfo, 0);
	int32		attempt = lease_attempt_from_arg(fcinfo, 1);

	(void) finish(NULL, "idem_dead()", id, attempt, FINISH_DEAD,
				  error_from_arg(fcinfo, 2), false, 0, NULL, NULL);
	PG_RETURN_VOID();
}

/*
 * idem_requeue(id): a dead or unknown message is queued again, due now,
 * with a new run of max_attempts attempts; the attempts go on counting up,
 * so no earlier token becomes valid again
 */
Datum
idem_requeue(PG_FUNCTION_ARGS)
{
	int64		id = id_from_arg(fcinfo, 0);
	Outbox		ob;
	Message		m;
	Datum	   *values;
	bool	   *nulls;
	MessageState s;

	require_outbox_primary("idem_requeue()");
	outbox_open(&ob, true);
	if (!lock_by_id(&ob, id, &m))
		report_no_message("idem_requeue()", id);
	s = shown_state(&m, ob.now);
	if (s != MSG_DEAD && s != MSG_UNKNOWN)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem_requeue(): outbox message %lld is %s", (long long) id,
						state_names[s]),
				 errdetail("Only a dead or unknown message can be queued again.")));
	access_copy_row(ob.slot, &values, &nulls);
	set_column(values, nulls, O_STATE,
			   CStringGetTextDatum(state_names[MSG_QUEUED]), false);
	set_column(values, nulls, O_ATTEMPT_BASE, Int32GetDatum(m.attempt), false);
	set_column(values, nulls, O_NOT_BEFORE, TimestampTzGetDatum(ob.now), false);
	set_column(values, nulls, O_FINISHED_AT, (Datum) 0, true);
	set_column(values, nulls, O_EXPIRES_AT,
			   TimestampTzGetDatum(m.created_at + m.retention),
			   m.retention < 0);
	update_row(&ob, &m.tid, values, nulls);
	Async_Notify(OUTBOX_CHANNEL, text_to_cstring(m.topic));
	outbox_close(&ob);
	PG_RETURN_VOID();
}

/*
 * idem_message(tenant, topic, key): the poll, as the caller's snapshot
 * shows the message; read-only, so it answers on a standby too
 */
Datum
idem_message(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemKey		key;
	Outbox		ob;

	key.tenant = key_part_from_arg(fcinfo, 0, "tenant");
	key.endpoint = key_part_from_arg(fcinfo, 1, "topic");
	key.key = key_part_from_arg(fcinfo, 2, "key");
	tenant_check(key.tenant);
	InitMaterializedSRF(fcinfo, 0);
	/* 0.4.0's objects show the trace too */
	if (rsinfo->setDesc->natts != 10 && rsinfo->setDesc->natts != 11)
		elog(ERROR, "incorrect number of output arguments");

	outbox_open(&ob, false);
	if (find_key(&ob, &key, GetActiveSnapshot()))
	{
		Message		m;
		Datum		row[11] = {0};
		bool		nulls[11] = {false};
		static const OutboxColumn copied[] = {O_LAST_ERROR, O_STATUS, O_BODY};

		deform_message(&ob, &m);
		row[0] = Int64GetDatum(m.id);
		row[1] = CStringGetTextDatum(state_names[shown_state(&m, ob.now)]);
		row[2] = Int32GetDatum(m.attempt);
		row[3] = TimestampTzGetDatum(m.not_before);
		for (int i = 0; i < (int) lengthof(copied); i++)
			row[4 + i] = COLUMN(&ob, copied[i], &nulls[4 + i]);
		row[7] = TimestampTzGetDatum(m.created_at);
		row[8] = COLUMN(&ob, O_FINISHED_AT, &nulls[8]);
		/* an unfinished message's expires_at is its retention's anchor */
		row[9] = COLUMN(&ob, O_EXPIRES_AT, &nulls[9]);
		nulls[9] = nulls[9] || !m.finished;
		nulls[10] = true;
		if (tables.trace != InvalidAttrNumber)
			row[10] = slot_getattr(ob.slot, tables.trace, &nulls[10]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, nulls);
	}
	outbox_close(&ob);
	return (Datum) 0;
}

/*
 * One purge batch of the outbox: delivered and dead messages whose expiry
 * has passed, at most batch of them, skipping any that another
 * transaction holds; *more tells whether a batch was full.  Through SQL,
 * as the records' purge is; nothing when the database has no outbox yet
 * (0.2.0's SQL objects, before ALTER EXTENSION idem UPDATE), or when a
 * logical-replication subscription receives idem_outbox (its publisher
 * purges it).
 */
uint64
outbox_purge_batch(TimestampTz now, int batch, bool *more)
{
	Oid			schema = idem_extension_schema();
	uint64		deleted;
	AccessAsOwner owner;
	Oid			relid = OidIsValid(schema) ?
		get_relname_relid("idem_outbox", schema) : InvalidOid;

	*more = false;
	if (!OidIsValid(relid) || OidIsValid(subscription_of(relid)))
		return 0;

	/* as the table's owner, as every access to it (outbox_open) */
	(void) outbox_relation();
	access_sql_enter(&owner, outbox_table.owner, schema);
	deleted = access_run_purge("DELETE FROM idem_outbox o"
							   " WHERE o.id OPERATOR(pg_catalog.=) ANY (ARRAY("
							   "SELECT m.id FROM idem_outbox m"
							   " WHERE m.state OPERATOR(pg_catalog.=) ANY (ARRAY['delivered', 'dead'])"
							   " AND m.expires_at OPERATOR(pg_catalog.<) $1"
							   " ORDER BY m.expires_at LIMIT $2"
							   " FOR UPDATE SKIP LOCKED))",
							   now, batch, more);
	access_sql_leave(&owner);
	return deleted;
}
