/*-------------------------------------------------------------------------
 *
 * record_way.h
 *	  The two ways into idem_record, behind record.h: the access handle,
 *	  the methods table each way fills in, and the facts both share.
 *
 * record.c reads and writes a local idem_record directly through its
 * unique index and the heap (direct_methods); record_sql.c goes through
 * SQL (SPI, sql_methods), which is what a table distributed by Citus
 * needs, and which also runs the purge, the listing and idem_forget's
 * deletion on either way.  record.c opens a bracket, picks the way from
 * what it knows of the table, and dispatches every call through the
 * handle's methods; nothing outside these two files includes this header.
 * The facts that must agree for fencing to be correct (the state names,
 * the stored fingerprint, the floor's buckets) are record.c's; the SQL
 * way's statements spell the bucket rule out, as the trigger does.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_WAY_H
#define IDEM_RECORD_WAY_H

#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"

#include "record.h"

typedef struct RecordMethods RecordMethods;

/* One open bracket of calls, from record_open() to record_close() */
struct RecordAccess
{
	const RecordMethods *methods;
	MemoryContext caller;		/* values read are copied here */
	MemoryContext bracket;		/* current when the bracket was opened */
	bool		batch;			/* record_open/close only switch "caller" */
	Oid			caller_userid;
	int			caller_sec_context;

	/* the direct way: the table, its key index, and a slot for its rows */
	Relation	rel;
	Relation	key_index;
	TupleTableSlot *slot;
	/* ... and for writing, set up at the first write */
	EState	   *estate;
	ResultRelInfo *rri;
	List	   *arbiters;		/* of a claim's insert: key_arbiters() */
	bool		only_arbiters;	/* no other unique or exclusion index */
	/* ... and the fencing floor, opened at a claim's first insert */
	Relation	floor;
	Relation	floor_index;
	TupleTableSlot *floor_slot;

	/*
	 * the SQL way: the key's lock (keylock.c), and the pinned settings;
	 * sql_entered: a direct bracket opened one of SQL too (sql_enter)
	 */
	bool		key_locked;
	bool		key_held_before;
	int			sql_nestlevel;
	bool		sql_entered;
};

/* What each way implements of record.h */
struct RecordMethods
{
	void		(*open) (RecordAccess *ra);
	void		(*close) (RecordAccess *ra);
	void		(*prepare_write) (RecordAccess *ra);
	bool		(*fetch) (RecordAccess *ra, const IdemKey *key,
						  IdemRecord *rec);
	RecordProbe (*probe) (RecordAccess *ra, const IdemKey *key, bool wait,
						  RecordIntent intent, IdemRecord *rec, bool *own);
	bool		(*busy) (RecordAccess *ra, const IdemKey *key);
	void		(*unlock) (RecordAccess *ra, const IdemKey *key);
	bool		(*insert_claim) (RecordAccess *ra, const IdemKey *key,
								 const IdemFingerprint *fp, TimestampTz now,
								 TimestampTz lease_expires_at,
								 TimestampTz expires_at, const char *trace,
								 int32 *attempt);
	RecordWrite (*write) (RecordAccess *ra, const IdemKey *key,
						  const IdemRecord *probed, const IdemRecord *next,
						  TimestampTz now, bool wait);
	bool		(*forget) (RecordAccess *ra, const IdemKey *key);
};

/* A way's methods table: each way names its methods <way>_<method> */
#define RECORD_METHODS(way) { \
	.open = way##_open, \
	.close = way##_close, \
	.prepare_write = way##_prepare_write, \
	.fetch = way##_fetch, \
	.probe = way##_probe, \
	.busy = way##_busy, \
	.unlock = way##_unlock, \
	.insert_claim = way##_insert_claim, \
	.write = way##_write, \
	.forget = way##_forget \
}

/* record_sql.c */
extern const RecordMethods sql_methods;
extern bool sql_distributed(Oid relid);
extern void sql_open(RecordAccess *ra);
extern void sql_close(RecordAccess *ra);
extern bool sql_delete(RecordAccess *ra, const IdemKey *key);
extern List *sql_purge_targets(RecordAccess *ra, bool *distributed);
extern uint64 sql_purge_batch(RecordAccess *ra, Oid target, TimestampTz now,
							  int batch, IdemPurgeScan *scan, bool *more);
extern List *sql_list(RecordAccess *ra, text *tenant, text *endpoint,
					  bool with_body, int32 max_rows, TupleDesc desc);
extern List *sql_suspects(RecordAccess *ra, TimestampTz from, Interval *within,
						  text *tenant, TimestampTz now, TupleDesc desc);

/* record.c: the facts both ways share */
extern const char *const record_state_names[];
extern IdemState record_state_of(const char *name);
extern Datum record_fingerprint_datum(const IdemFingerprint *fp);
extern void record_read_fingerprint(Datum stored, IdemFingerprint *fp);
extern void record_hold_floor(const int32 *buckets, int n, bool *held);

#endif							/* IDEM_RECORD_WAY_H */
