/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL majors idem supports (15-19),
 *	  in one place.
 *
 * Code elsewhere is written against the newest major's names; this header
 * supplies them on the older ones.  It is included by idem.h, so every
 * room sees it, and nothing outside it tests PG_VERSION_NUM.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "idem needs PostgreSQL 15 or later"
#endif

/* 16 moved the varlena access macros (VARDATA_ANY, ...) to varatt.h */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * Symbol visibility.  From 16 on, PGXS builds modules with
 * -fvisibility=hidden and PGDLLEXPORT marks what the server looks up by name
 * (the SQL functions' pg_finfo_ records and entry points, the magic block,
 * _PG_init, the background workers' main functions); the Makefile hides
 * symbols on 15 too, so PGDLLEXPORT must mean the same there, and
 * _PG_init is declared as 16's fmgr.h declares it.  Nothing else of idem is
 * then visible to, or can be interposed by, another loaded library.
 */
#if PG_VERSION_NUM < 160000
#include "fmgr.h"
#undef PGDLLEXPORT
#define PGDLLEXPORT __attribute__((visibility("default")))
extern PGDLLEXPORT void _PG_init(void);
/* 16's PG_FUNCTION_INFO_V1 exports the function, not only its info record */
#undef PG_FUNCTION_INFO_V1
#define PG_FUNCTION_INFO_V1(funcname) \
extern PGDLLEXPORT Datum funcname(PG_FUNCTION_ARGS); \
extern PGDLLEXPORT const Pg_finfo_record * CppConcat(pg_finfo_,funcname)(void); \
const Pg_finfo_record * \
CppConcat(pg_finfo_,funcname) (void) \
{ \
	static const Pg_finfo_record my_finfo = { 1 }; \
	return &my_finfo; \
} \
extern int no_such_variable
#endif

/*
 * 18 replaced the pg_attribute_noreturn() suffix with a pg_noreturn prefix.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/* 17 added infinite intervals */
#include "datatype/timestamp.h"

static inline bool
idem_interval_is_finite(const Interval *span)
{
#if PG_VERSION_NUM >= 170000
	return !INTERVAL_NOT_FINITE(span);
#else
	return true;
#endif
}


/*
 * A wait event of idem's own, by name, as pg_stat_activity.wait_event shows
 * it: 17 added custom wait events for extensions (WaitEventExtensionNew);
 * before, every wait of an extension shows as "Extension".  Its type is
 * "Extension" either way.  The caller keeps what it returns.
 */
#include "utils/wait_event.h"

static inline uint32
idem_wait_event(const char *name)
{
#if PG_VERSION_NUM >= 170000
	return WaitEventExtensionNew(name);
#else
	return PG_WAIT_EXTENSION;
#endif
}

/*
 * Direct record access (record.c).  Index scans: 18 added an
 * IndexScanInstrumentation argument, 19 a flags argument.
 */
#include "access/genam.h"
#include "access/tableam.h"
#include "executor/executor.h"

static inline IndexScanDesc
idem_index_beginscan(Relation heap, Relation index, Snapshot snapshot,
					 int nkeys)
{
#if PG_VERSION_NUM >= 190000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, 0, SO_NONE);
#elif PG_VERSION_NUM >= 180000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, 0);
#else
	return index_beginscan(heap, index, snapshot, nkeys, 0);
#endif
}

/*
 * Insert a new heap tuple's index entries (never as an update: idem does
 * not pass the "index unchanged" hint, which needs a range table).  With
 * no_dup_err, a unique index in arbiters reports a conflict through
 * *spec_conflict instead of erroring, as INSERT ... ON CONFLICT does.  16
 * added "only summarizing indexes"; 19 turned the booleans into flags.
 */
static inline void
idem_insert_index_tuples(ResultRelInfo *rri, EState *estate,
						 TupleTableSlot *slot, bool no_dup_err,
						 bool only_summarizing, bool *spec_conflict,
						 List *arbiters)
{
	List	   *recheck;

#if PG_VERSION_NUM >= 190000
	recheck = ExecInsertIndexTuples(rri, estate,
									(no_dup_err ? EIIT_NO_DUPE_ERROR : 0) |
									(only_summarizing ? EIIT_ONLY_SUMMARIZING : 0),
									slot, arbiters, spec_conflict);
#elif PG_VERSION_NUM >= 160000
	recheck = ExecInsertIndexTuples(rri, slot, estate, false, no_dup_err,
									spec_conflict, arbiters,
									only_summarizing);
#else
	Assert(!only_summarizing);
	recheck = ExecInsertIndexTuples(rri, slot, estate, false, no_dup_err,
									spec_conflict, arbiters);
#endif
	list_free(recheck);
}

/*
 * Replace the tuple at otid (which the caller has locked) with slot's.
 * Returns whether the new version needs index entries; *only_summarizing
 * says whether only summarizing indexes need them (16+: TU_UpdateIndexes).
 */
static inline bool
idem_simple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot,
				   Snapshot snapshot, bool *only_summarizing)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;

	simple_table_tuple_update(rel, otid, slot, snapshot, &update_indexes);
	*only_summarizing = update_indexes == TU_Summarizing;
	return update_indexes != TU_None;
#else
	bool		update_indexes;

	simple_table_tuple_update(rel, otid, slot, snapshot, &update_indexes);
	*only_summarizing = false;
	return update_indexes;
#endif
}

/*
 * Every configuration variable, placeholders included (16 returns a
 * palloc'd array and counts it; 15 hands out its own array)
 */
#include "utils/guc_tables.h"

static inline struct config_generic **
idem_guc_variables(int *n)
{
#if PG_VERSION_NUM >= 160000
	return get_guc_variables(n);
#else
	*n = GetNumConfigOptions();
	return get_guc_variables();
#endif
}

#endif							/* IDEM_COMPAT_H */
