/*-------------------------------------------------------------------------
 *
 * record.h
 *	  The two ways into idem_record, as record.c dispatches to them.
 *
 * record.c reads and writes a local idem_record directly through its
 * unique index and the heap; record_sql.c goes through SQL (SPI), which
 * is what a table distributed by Citus needs, and which also runs the
 * purge, the listing and idem_forget.  Nothing outside these two files
 * includes this header.  record_sql.c calls back into record.c for one
 * thing only: the purge takes the fencing floor's rows directly, without
 * waiting (idem_hold_floor), which SQL cannot do for a row that another
 * transaction is inserting.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include "idem.h"

/* record_sql.c */
extern void sql_open(MemoryContext caller);
extern void sql_close(void);
extern bool sql_distributed(Oid relid);
extern bool sql_fetch(const IdemKey *key, bool latest, IdemRecord *rec);
extern RecordProbe sql_probe(const IdemKey *key, bool wait, IdemRecord *rec,
							 bool *own);
extern bool sql_busy(const IdemKey *key);
extern void sql_unlock(const IdemKey *key);
extern bool sql_insert_claim(const IdemKey *key, const IdemFingerprint *fp,
							 TimestampTz now, TimestampTz lease_expires_at,
							 TimestampTz expires_at, int32 *attempt);
extern RecordWrite sql_reclaim(const IdemKey *key, const IdemRecord *rec,
							   TimestampTz now, bool wait);
extern RecordWrite sql_finish(const IdemKey *key, IdemState state,
							  bool retryable, bool has_status, int32 status,
							  bytea *body, Jsonb *headers, TimestampTz now);
extern List *sql_purge_targets(bool *distributed);
extern uint64 sql_purge_batch(Oid target, TimestampTz now, int batch,
							  IdemPurgeScan *scan, bool *more);
extern List *sql_list(text *tenant, text *endpoint, bool with_body,
					  int32 max_rows, TupleDesc desc);
extern bool sql_forget(const IdemKey *key);

/* record.c, for the purge's statements in record_sql.c */
extern void idem_hold_floor(const int32 *buckets, int n, bool *held);

/* The names of idem_record.state, indexed by IdemState */
extern const char *const record_state_names[];

#endif							/* IDEM_RECORD_H */
