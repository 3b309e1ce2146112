/*-------------------------------------------------------------------------
 *
 * access.h
 *	  What record.c and outbox.c share to reach a table of idem's directly,
 *	  the way core's executor does.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ACCESS_H
#define IDEM_ACCESS_H

#include "access/tableam.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"

/*
 * A table's CHECK and NOT NULL constraints, as ExecConstraints applies
 * them, with the expressions prepared once per backend (in an executor
 * state of their own) rather than once per call
 */
typedef struct AccessChecks
{
	bool		valid;
	EState	   *estate;
	ResultRelInfo *rri;
} AccessChecks;

extern Oid	access_table(const char *name, Oid schema);
extern Oid	access_index_of(const char *name, Oid schema, Oid table);
extern void access_require_heap(Relation rel);
extern void access_check_row(AccessChecks *checks, Relation rel,
							 TupleTableSlot *slot);
extern void access_copy_row(TupleTableSlot *slot, Datum **values,
							bool **nulls);
extern void access_store_row(AccessChecks *checks, Relation rel,
							 TupleTableSlot *slot, const Datum *values,
							 const bool *nulls);
extern void access_update_row(AccessChecks *checks, Relation rel,
							  ResultRelInfo *rri, EState *estate,
							  TupleTableSlot *slot, ItemPointer tid,
							  const Datum *values, const bool *nulls);
extern bool access_insert_speculative(ResultRelInfo *rri, EState *estate,
									  TupleTableSlot *slot, List *arbiters);
extern TM_Result access_lock_row(Relation rel, ItemPointer tid,
								 Snapshot snapshot, TupleTableSlot *slot,
								 LockWaitPolicy policy, bool find_last,
								 const char *what);
extern void access_columns(Relation rel, const char *const *names, int n,
						   AttrNumber *attnum);

#endif							/* IDEM_ACCESS_H */
