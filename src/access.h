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

/* The most columns a table of idem's has that its room finds by name */
#define ACCESS_MAX_COLUMNS	24

/*
 * What a room knows of a table of idem's that it reaches directly: looked
 * up once per backend (access_relation), and again after a relcache
 * invalidation of the table or of the one other table (if any) whose
 * look-up goes with it, together with the rest of what the room needs of
 * it (its indexes: look_up_rest).
 */
typedef struct AccessTable AccessTable;

struct AccessTable
{
	const char *name;
	const char *const *columns; /* the columns the room reads, by name */
	int			ncolumns;
	bool		registered;		/* its relcache callback is */
	bool		valid;
	Oid			relid;
	Oid			other;
	Oid			owner;
	AttrNumber	attnum[ACCESS_MAX_COLUMNS];
	AccessChecks checks;
	/* the rest of what the room looks up with the table, in schema */
	void		(*look_up_rest) (AccessTable *t, Oid schema);
};

/*
 * A table named table whose room reads the columns of the array names, and
 * looks up the rest with rest
 */
#define ACCESS_TABLE(table, names, rest) \
	{.name = (table), .columns = (names), .ncolumns = lengthof(names), \
	 .look_up_rest = (rest)}

/* Store a value of column c (an index of columns) in a row being built */
static inline void
access_set_column(const AccessTable *t, Datum *values, bool *nulls, int c,
				  Datum value, bool isnull)
{
	values[t->attnum[c] - 1] = value;
	nulls[t->attnum[c] - 1] = isnull;
}

/* The most key columns of an index of idem's */
#define ACCESS_INDEX_MAX_COLUMNS	4

/*
 * An index of idem's as the install script makes it, which the room that
 * reads or writes it directly relies on: a B-tree on the columns named, in
 * that order, ascending, in the columns' collations, unique or not, with no
 * expression, and with the predicate given (as pg_get_expr() shows it) or
 * none.  An index of another shape is refused where it is looked up.
 */
typedef struct AccessIndex
{
	const char *name;
	bool		unique;
	const char *columns[ACCESS_INDEX_MAX_COLUMNS];	/* up to the first NULL */
	const char *predicate;
} AccessIndex;

extern Oid	access_relation(AccessTable *t);
extern Relation access_open(AccessTable *t, bool other, LOCKMODE lockmode);
extern Oid	access_table(const char *name, Oid schema);
extern Oid	access_index_of(const AccessIndex *shape, Oid schema, Oid table);
extern List *access_arbiters(ResultRelInfo *rri, const AttrNumber *attnums,
							 int n);
extern void access_require_heap(Oid relid);
extern void access_refuse_write_triggers(Oid relid);
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
/* A caller's identity, kept while a room runs SQL as a table's owner */
typedef struct AccessAsOwner
{
	Oid			caller_userid;
	int			caller_sec_context;
	int			nestlevel;
} AccessAsOwner;

extern void access_sql_enter(AccessAsOwner *a, Oid owner, Oid schema);
extern Oid	access_sql_enter_table(AccessAsOwner *a, const char *name);
extern void access_sql_leave(AccessAsOwner *a);
extern uint64 access_run_sql(const char *sql, int nargs, Oid *argtypes,
							 Datum *values, bool read_only, int expected);
extern uint64 access_run_purge(const char *sql, TimestampTz now, int batch,
							   bool *more);
extern AttrNumber access_optional_column(Oid relid, const char *name,
										 Oid type);
extern void access_columns(Relation rel, const char *const *names, int n,
						   AttrNumber *attnum);

#endif							/* IDEM_ACCESS_H */
