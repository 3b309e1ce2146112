/*-------------------------------------------------------------------------
 *
 * access.c
 *	  Reaching a table of idem's directly, the way core's executor does:
 *	  looking it up (its indexes, access method and columns by name), and
 *	  inserting, locking and updating its rows.
 *
 * record.c (idem_record) and outbox.c (idem_outbox) read heap tuples and
 * write through index and heap access methods; both look their table up
 * once per backend and again after a relcache invalidation, with these
 * functions, so that a table that is not what the install script made (an
 * index dropped, a column renamed, another access method) is refused with
 * a message naming what is missing rather than read wrongly.  Columns are
 * found by name, not by position, so a dropped column or a column added by
 * an upgrade script does not move them.
 *
 * A heap insert or update applies none of the table's constraints: the row
 * about to be written goes through ExecConstraints first, as
 * execReplication.c does, so that a CHECK a DBA or a later release adds is
 * enforced here too and its error names the constraint and the table.
 * Preparing the constraints' expressions costs more than the write itself,
 * so they are prepared once per backend, in an executor state that lives
 * until the table's relcache entry is invalidated (access_invalidate).
 *
 * An insert that a unique index must decide is a speculative insertion, as
 * INSERT ... ON CONFLICT makes it (access_insert_speculative), and a row
 * is locked before it is updated as the executor locks it
 * (access_lock_row): both tables' writers go through these two, so the
 * rules of core's conflict loop hold for both.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/readfuncs.h"
#include "storage/lmgr.h"
#include "storage/sinval.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/ruleutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "access.h"
#include "compat.h"
#include "extension.h"
#include "settings.h"


/*
 * The OID of table name in schema (the extension's, InvalidOid when it is
 * not installed); an error if there is none
 */
Oid
access_table(const char *name, Oid schema)
{
	Oid			table = OidIsValid(schema) ?
		get_relname_relid(name, schema) : InvalidOid;

	if (!OidIsValid(table))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s\" of extension \"idem\" does not exist in this database",
						name)));
	return table;
}

/* Whether index irel of table has the shape idem relies on */
static bool
index_has_shape(Relation irel, const AccessIndex *shape, Oid table)
{
	Form_pg_index ix = irel->rd_index;
	int			n = 0;
	bool		isnull;
	Datum		pred;
	int			nestlevel;
	char	   *shown;

	while (n < ACCESS_INDEX_MAX_COLUMNS && shape->columns[n] != NULL)
		n++;
	if (irel->rd_rel->relam != BTREE_AM_OID ||
		ix->indisunique != shape->unique || ix->indisexclusion ||
		(shape->unique && !ix->indimmediate) ||
		ix->indnatts != n || ix->indnkeyatts != n ||
		!heap_attisnull(irel->rd_indextuple, Anum_pg_index_indexprs, NULL))
		return false;
	for (int i = 0; i < n; i++)
	{
		AttrNumber	attnum = get_attnum(table, shape->columns[i]);
		Oid			type;
		int32		typmod;
		Oid			collation;

		if (attnum == InvalidAttrNumber || ix->indkey.values[i] != attnum ||
			irel->rd_indoption[i] != 0)
			return false;
		get_atttypetypmodcoll(table, attnum, &type, &typmod, &collation);
		if (irel->rd_indcollation[i] != collation)
			return false;
	}
	pred = SysCacheGetAttr(INDEXRELID, irel->rd_indextuple,
						   Anum_pg_index_indpred, &isnull);
	if (isnull || shape->predicate == NULL)
		return isnull && shape->predicate == NULL;

	/*
	 * Compared as pg_get_expr() shows it, under a path on which the types
	 * it names need no schema and with identifiers quoted only where they
	 * must be, whatever the caller's settings are
	 */
	nestlevel = settings_pin_search_path(InvalidOid);
	(void) set_config_option("quote_all_identifiers", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	shown = deparse_expression(stringToNode(TextDatumGetCString(pred)),
							   deparse_context_for(get_rel_name(table), table),
							   false, false);
	AtEOXact_GUC(true, nestlevel);
	return strcmp(shown, shape->predicate) == 0;
}

/*
 * The OID of the index that shape describes, of table, in schema: an error
 * if there is none, or if it has another shape.  A unique index on other
 * columns (or in another order, or without UNIQUE) would let the probe find
 * another tenant's record, or two claims of one key both insert; a scan
 * that reads the index's columns by position would read the wrong ones.
 */
Oid
access_index_of(const AccessIndex *shape, Oid schema, Oid table)
{
	Oid			index = get_relname_relid(shape->name, schema);
	Relation	irel;
	bool		ok;

	if (!OidIsValid(index) || IndexGetRelation(index, true) != table)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("index \"%s\" of extension \"idem\" does not exist in this database",
						shape->name)));
	irel = index_open(index, AccessShareLock);
	ok = index_has_shape(irel, shape, table);
	index_close(irel, AccessShareLock);
	if (!ok)
	{
		StringInfoData def;

		initStringInfo(&def);
		appendStringInfo(&def, "CREATE %sINDEX %s ON %s (",
						 shape->unique ? "UNIQUE " : "", shape->name,
						 get_rel_name(table));
		for (int i = 0; i < ACCESS_INDEX_MAX_COLUMNS && shape->columns[i]; i++)
			appendStringInfo(&def, "%s%s", i > 0 ? ", " : "",
							 shape->columns[i]);
		appendStringInfoChar(&def, ')');
		if (shape->predicate != NULL)
			appendStringInfo(&def, " WHERE %s", shape->predicate);
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" of extension \"idem\" is not defined as idem requires",
						shape->name),
				 errdetail("idem requires %s.", def.data),
				 errhint("Drop the index and create it again as the detail shows.")));
	}
	return index;
}

/*
 * The arbiters of a speculative insertion into the table of rri (its
 * indexes opened): every unique index on exactly the n columns attnums,
 * as infer_arbiter_indexes() picks them for ON CONFLICT (columns), valid or
 * not.  REINDEX CONCURRENTLY builds a second unique index (its name ends in
 * _ccnew), which takes entries and checks uniqueness before it is valid,
 * and after the swap retires the old one (_ccold), which takes entries
 * until it is dead; a unique index that is not an arbiter waits for a
 * concurrent inserter of the key and then fails with a unique violation,
 * where the caller must probe again.  An index not ready for entries is
 * skipped by ExecInsertIndexTuples.
 */
List *
access_arbiters(ResultRelInfo *rri, const AttrNumber *attnums, int n)
{
	List	   *arbiters = NIL;

	for (int i = 0; i < rri->ri_NumIndices; i++)
	{
		Form_pg_index index = rri->ri_IndexRelationDescs[i]->rd_index;
		IndexInfo  *info = rri->ri_IndexRelationInfo[i];
		bool		on_key = true;

		if (!index->indisunique || index->indisexclusion ||
			!index->indimmediate || info->ii_Expressions != NIL ||
			info->ii_Predicate != NIL || info->ii_NumIndexKeyAttrs != n)
			continue;
		for (int c = 0; c < n; c++)
		{
			bool		found = false;

			for (int k = 0; k < info->ii_NumIndexKeyAttrs; k++)
				found |= info->ii_IndexAttrNumbers[k] == attnums[c];
			on_key &= found;
		}

		/*
		 * ... whose equality is the probe's: the columns' collations and
		 * the default operator classes, or a conflict in it would be one
		 * the probe cannot find, and the insertion would be tried again
		 * and again.  The type cache keeps the default class's family (and
		 * forgets it when pg_opclass changes): every write's bracket asks,
		 * and GetDefaultOpClass would scan pg_opclass each time.
		 */
		for (int k = 0; on_key && k < info->ii_NumIndexKeyAttrs; k++)
		{
			Relation	irel = rri->ri_IndexRelationDescs[i];
			Oid			type;
			int32		typmod;
			Oid			collation;

			get_atttypetypmodcoll(RelationGetRelid(rri->ri_RelationDesc),
								  info->ii_IndexAttrNumbers[k], &type,
								  &typmod, &collation);
			on_key = irel->rd_rel->relam == BTREE_AM_OID &&
				irel->rd_indcollation[k] == collation &&
				irel->rd_opfamily[k] ==
				lookup_type_cache(type, TYPECACHE_BTREE_OPFAMILY)->btree_opf;
		}
		if (on_key)
			arbiters = lappend_oid(arbiters, index->indexrelid);
	}
	return arbiters;
}

/*
 * Refuse table relid if a trigger fires on its INSERT or UPDATE: idem
 * inserts and updates the rows of a table it reaches directly as core's
 * apply worker does, through the heap and index access methods, and fires
 * no trigger there (a row trigger would run user code between the probe
 * and the write, and could change the row whose uniqueness decides), so a
 * trigger a DBA adds would fire on the SQL way and be skipped here.  A
 * FOREIGN KEY of the table and a DEFERRABLE unique or exclusion constraint
 * are checked by such triggers too, and refused with them, naming the
 * constraint.  Not refused: a disabled trigger (it fires nowhere); a
 * trigger on DELETE or TRUNCATE (idem deletes through SQL, which fires
 * it); and the triggers of a foreign key that references the table, which
 * check only a change of the referenced columns (idem never changes a key)
 * or a deletion.
 */
void
access_refuse_write_triggers(Oid relid)
{
	Relation	rel = table_open(relid, AccessShareLock);
	TriggerDesc *td = rel->trigdesc;

	for (int i = 0; td != NULL && i < td->numtriggers; i++)
	{
		Trigger    *tg = &td->triggers[i];

		if (!(TRIGGER_FOR_INSERT(tg->tgtype) || TRIGGER_FOR_UPDATE(tg->tgtype)) ||
			tg->tgenabled == TRIGGER_DISABLED ||
			(tg->tgisinternal && RI_FKey_trigger_type(tg->tgfoid) == RI_TRIGGER_PK))
			continue;
		if (OidIsValid(tg->tgconstraint))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("table \"%s\" has constraint \"%s\", which idem cannot enforce",
							RelationGetRelationName(rel),
							get_constraint_name(tg->tgconstraint)),
					 errdetail("idem writes the table's rows directly, applying its CHECK and NOT NULL constraints and its immediate unique indexes; a foreign key or a deferrable constraint is checked by a row trigger, which idem does not fire."),
					 errhint("Drop the constraint.")));
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has trigger \"%s\" on INSERT or UPDATE, which idem does not fire",
						RelationGetRelationName(rel), tg->tgname),
				 errdetail("idem inserts and updates the table's rows directly, as core's apply worker does, and fires no trigger there."),
				 errhint("Drop or disable the trigger. A trigger on DELETE or TRUNCATE fires: idem deletes through SQL.")));
	}
	table_close(rel, AccessShareLock);
}

/* Direct access reads heap tuples: refuse a table of another access method */
void
access_require_heap(Oid relid)
{
	Relation	rel = table_open(relid, AccessShareLock);

	if (rel->rd_rel->relam != HEAP_TABLE_AM_OID)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" must use the heap access method",
						RelationGetRelationName(rel)),
				 errdetail("It uses access method \"%s\".",
						   get_am_name(rel->rd_rel->relam))));
	table_close(rel, AccessShareLock);
}

static void
access_invalidate(Datum arg, Oid relid)
{
	AccessTable *t = (AccessTable *) DatumGetPointer(arg);

	if (relid == InvalidOid || relid == t->relid ||
		(OidIsValid(t->other) && relid == t->other))
	{
		t->valid = false;
		t->checks.valid = false;
	}
}

/*
 * The OID of table t, looked up first if need be, in the extension's
 * schema: its OID, its owner (whom a room runs as while it reaches the
 * table), its columns by name, and the rest its room needs.
 */
Oid
access_relation(AccessTable *t)
{
	Oid			schema;
	Relation	rel;

	if (t->valid)
		return t->relid;
	Assert(t->ncolumns <= ACCESS_MAX_COLUMNS);
	if (!t->registered)
	{
		idem_on_relcache_change(access_invalidate, PointerGetDatum(t));
		t->registered = true;
	}

	/*
	 * Opening a table processes pending invalidations, which may concern
	 * what was just looked up (an ALTER TABLE, idem_distribute()): as
	 * RangeVarGetRelidExtended does, look up again until no invalidation
	 * arrived meanwhile, so that what is kept is as of after the last one.
	 */
	for (;;)
	{
		uint64		invalidations = SharedInvalidMessageCounter;

		schema = idem_extension_schema();
		t->relid = access_table(t->name, schema);
		rel = table_open(t->relid, AccessShareLock);
		t->owner = rel->rd_rel->relowner;
		access_columns(rel, t->columns, t->ncolumns, t->attnum);
		table_close(rel, AccessShareLock);
		t->look_up_rest(t, schema);
		if (invalidations == SharedInvalidMessageCounter)
			break;
	}
	t->valid = true;
	return t->relid;
}

/*
 * Open t's table (other: the one other table looked up with it) with
 * lockmode, and look it up again if taking the lock processed an
 * invalidation of it: what the room then reads of the look-up (its
 * indexes' OIDs) is as of after the lock, which keeps them from being
 * dropped (REINDEX CONCURRENTLY waits for the table's lockers first).
 */
Relation
access_open(AccessTable *t, bool other, LOCKMODE lockmode)
{
	for (;;)
	{
		Oid			relid;
		Relation	rel;

		(void) access_relation(t);
		relid = other ? t->other : t->relid;
		rel = table_open(relid, lockmode);
		if (t->valid && relid == (other ? t->other : t->relid))
			return rel;
		table_close(rel, NoLock);
	}
}

/* The attribute numbers of the n columns names of rel; an error for one missing */
void
access_columns(Relation rel, const char *const *names, int n,
			   AttrNumber *attnum)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int c = 0; c < n; c++)
	{
		attnum[c] = InvalidAttrNumber;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), names[c]) == 0)
				attnum[c] = att->attnum;
		}
		if (attnum[c] == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of table \"%s\" does not exist",
							names[c], RelationGetRelationName(rel))));
	}
}

/*
 * The attribute number of a column that a later release's upgrade script
 * adds (0.4.0's trace), InvalidAttrNumber in a table of older objects;
 * an error for one of another type than the script makes
 */
AttrNumber
access_optional_column(Oid relid, const char *name, Oid type)
{
	AttrNumber	attnum = get_attnum(relid, name);

	if (attnum != InvalidAttrNumber && get_atttype(relid, attnum) != type)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of table \"%s\" has type %s, idem needs %s",
						name, get_rel_name(relid),
						format_type_be(get_atttype(relid, attnum)),
						format_type_be(type))));
	return attnum;
}

/*
 * Apply rel's constraints to the row in slot: an error (23514, 23502) if
 * it breaks one.  The prepared expressions are kept in checks, until
 * access_invalidate clears checks->valid for an invalidation of rel.
 */
void
access_check_row(AccessChecks *checks, Relation rel, TupleTableSlot *slot)
{
	if (!checks->valid)
	{
		MemoryContext old;

		if (checks->estate != NULL)
			FreeExecutorState(checks->estate);
		old = MemoryContextSwitchTo(TopMemoryContext);
		checks->estate = CreateExecutorState();
		MemoryContextSwitchTo(checks->estate->es_query_cxt);
		checks->rri = makeNode(ResultRelInfo);
		InitResultRelInfo(checks->rri, rel, 0, NULL, 0);
		MemoryContextSwitchTo(old);
		checks->valid = true;
	}
	/* the relcache entry of an open relation keeps its address */
	checks->rri->ri_RelationDesc = rel;
	ExecConstraints(checks->rri, slot, checks->estate);
	ResetPerTupleExprContext(checks->estate);
}

/*
 * The row in slot (a locked tuple), as values to change and write back.
 * The values of a tuple that a buffer holds point into the page, which the
 * slot stops pinning when the new row is stored into it (then VACUUM or
 * pruning may move what they point to): they come from a copy of the
 * tuple, in the current memory context, not from the slot.
 */
void
access_copy_row(TupleTableSlot *slot, Datum **values, bool **nulls)
{
	TupleDesc	desc = slot->tts_tupleDescriptor;
	HeapTuple	copy = ExecCopySlotHeapTuple(slot);

	*values = palloc(desc->natts * sizeof(Datum));
	*nulls = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(copy, desc, *values, *nulls);
}

/* Put a row into slot and apply rel's constraints to it */
void
access_store_row(AccessChecks *checks, Relation rel, TupleTableSlot *slot,
				 const Datum *values, const bool *nulls)
{
	int			natts = slot->tts_tupleDescriptor->natts;

	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, natts * sizeof(Datum));
	memcpy(slot->tts_isnull, nulls, natts * sizeof(bool));
	ExecStoreVirtualTuple(slot);
	access_check_row(checks, rel, slot);
}

/*
 * Replace the version at tid (locked or inserted by this transaction) with
 * the row in values, and give it index entries unless it is a HOT update
 */
void
access_update_row(AccessChecks *checks, Relation rel, ResultRelInfo *rri,
				  EState *estate, TupleTableSlot *slot, ItemPointer tid,
				  const Datum *values, const bool *nulls)
{
	bool		only_summarizing;

	access_store_row(checks, rel, slot, values, nulls);
	if (idem_simple_update(rel, tid, slot, GetActiveSnapshot(),
						   &only_summarizing))
		idem_insert_index_tuples(rri, estate, slot, false, only_summarizing,
								 NULL, NIL);
	CommandCounterIncrement();
	ResetPerTupleExprContext(estate);
}

/*
 * Insert the row in slot speculatively, as INSERT ... ON CONFLICT DO
 * NOTHING does (ExecInsert): the heap tuple under a speculative insertion
 * token, then its index entries, the arbiters checked without an error;
 * if one of them found a conflicting entry, the tuple is killed
 * (heap_abort_speculative) and false comes back.  Of two transactions
 * inserting one key at once, at most one succeeds, and neither waits for
 * the other's transaction: only, briefly and on one side, for its
 * speculative insertion, as check_exclusion_or_unique_constraint's
 * livelock rule says.  The caller decides, after a conflict, what the key
 * holds.
 */
bool
access_insert_speculative(ResultRelInfo *rri, EState *estate,
						  TupleTableSlot *slot, List *arbiters)
{
	Relation	rel = rri->ri_RelationDesc;
	uint32		token;
	bool		conflict = false;

	token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
	table_tuple_insert_speculative(rel, slot, GetCurrentCommandId(true), 0,
								   NULL, token);
	idem_insert_index_tuples(rri, estate, slot, true, false, &conflict,
							 arbiters);
	table_tuple_complete_speculative(rel, slot, token, !conflict);
	SpeculativeInsertionLockRelease(GetCurrentTransactionId());
	ResetPerTupleExprContext(estate);
	return !conflict;
}

/*
 * Lock the version of rel at *tid for an update (LockTupleNoKeyExclusive),
 * as the executor locks a row before it changes it, and read it into slot.
 * With find_last, the newest version of the row is locked (and *tid moves
 * to it).  Returns TM_Ok, TM_WouldBlock (another transaction holds it and
 * policy is LockWaitSkip), TM_Updated or TM_Deleted (another transaction
 * changed it since snapshot: the caller looks again).  The rest is handled
 * as ExecOnConflictLockRow does: a version that this transaction inserted
 * and this very command already changed is an error (21000; what names the
 * row for its message), anything else unexpected an internal error.
 */
TM_Result
access_lock_row(Relation rel, ItemPointer tid, Snapshot snapshot,
				TupleTableSlot *slot, LockWaitPolicy policy, bool find_last,
				const char *what)
{
	TM_FailureData tmfd;
	TM_Result	result;

	result = table_tuple_lock(rel, tid, snapshot, slot,
							  GetCurrentCommandId(false),
							  LockTupleNoKeyExclusive, policy,
							  find_last ? TUPLE_LOCK_FLAG_FIND_LAST_VERSION : 0,
							  &tmfd);
	switch (result)
	{
		case TM_Ok:
		case TM_WouldBlock:
		case TM_Updated:
		case TM_Deleted:
			return result;
		case TM_Invisible:
			{
				bool		isnull;
				Datum		xmin = slot_getsysattr(slot,
												   MinTransactionIdAttributeNumber,
												   &isnull);

				if (TransactionIdIsCurrentTransactionId(DatumGetTransactionId(xmin)))
					ereport(ERROR,
							(errcode(ERRCODE_CARDINALITY_VIOLATION),
							 errmsg("%s was already changed by this command", what),
							 errhint("Call idem's functions for one key or message at most once in a statement that changes it.")));
				elog(ERROR, "attempted to lock invisible tuple");
			}
			break;
		case TM_SelfModified:
			elog(ERROR, "unexpected self-updated tuple");
			break;
		default:
			elog(ERROR, "unexpected table_tuple_lock status: %u", result);
	}
	pg_unreachable();
}

/*
 * Run SQL as owner, the owner of a table of idem's: switch to it, pin
 * search_path to pg_catalog and schema, and connect to SPI, until
 * access_sql_leave (an error in between restores all of it with the
 * transaction's abort).  Callers check the tenant binding before, as the
 * caller.
 */
void
access_sql_enter(AccessAsOwner *a, Oid owner, Oid schema)
{
	GetUserIdAndSecContext(&a->caller_userid, &a->caller_sec_context);
	SetUserIdAndSecContext(owner,
						   a->caller_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	a->nestlevel = settings_pin_search_path(schema);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * access_sql_enter for table name of idem's, in the extension's schema: its
 * OID, or InvalidOid, entering nothing, when this database has no such
 * table (SQL objects of a release older than the table)
 */
Oid
access_sql_enter_table(AccessAsOwner *a, const char *name)
{
	Oid			schema = idem_extension_schema();
	Oid			relid = OidIsValid(schema) ?
		get_relname_relid(name, schema) : InvalidOid;
	HeapTuple	tuple;
	Oid			owner;

	if (!OidIsValid(relid))
		return InvalidOid;
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	access_sql_enter(a, owner, schema);
	return relid;
}

void
access_sql_leave(AccessAsOwner *a)
{
	SPI_finish();
	AtEOXact_GUC(true, a->nestlevel);
	SetUserIdAndSecContext(a->caller_userid, a->caller_sec_context);
}

/*
 * Run sql through SPI (the caller is connected), with values of argtypes
 * for its parameters, and check that it answered as expected
 * (SPI_OK_SELECT, ...); the rows it returned or changed.  Statements that
 * idem runs through SPI once per call, not on a request's path: the
 * record room's kept plans (record_sql.c) are for those.
 */
uint64
access_run_sql(const char *sql, int nargs, Oid *argtypes, Datum *values,
			   bool read_only, int expected)
{
	int			rc = SPI_execute_with_args(sql, nargs, argtypes, values,
										   NULL, read_only, 0);

	if (rc != expected)
		elog(ERROR, "SPI_execute_with_args failed: %s",
			 SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * Run a purge's DELETE (the caller is connected), whose parameters are $1,
 * the time before which what expired is deleted, and $2, the most rows one
 * batch deletes; *more when the batch was full.  How many it deleted.
 */
uint64
access_run_purge(const char *sql, TimestampTz now, int batch, bool *more)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, INT4OID};
	Datum		values[2];
	uint64		deleted;

	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(batch);
	deleted = access_run_sql(sql, 2, argtypes, values, false, SPI_OK_DELETE);
	*more = deleted >= (uint64) batch;
	return deleted;
}
