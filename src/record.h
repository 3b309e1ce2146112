/*-------------------------------------------------------------------------
 *
 * record.h
 *	  The one interface to idem_record: what the protocol, the purge and
 *	  the subscription check may ask of the record room.
 *
 * Every call takes the access handle that record_open() returned (or a
 * batch's, from record_batch_open()), and a write takes the record that a
 * probe read, whose version it acts on: nothing about a call is kept
 * between calls but per-backend caches of the table's OIDs and plans.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include "idem.h"

#include "storage/itemptr.h"

/* An open bracket of calls on idem_record (record.c, record_way.h) */
typedef struct RecordAccess RecordAccess;

/* A record as read from idem_record */
typedef struct IdemRecord
{
	IdemState	state;
	bool		retryable;
	IdemFingerprint fingerprint;
	bool		has_status;
	int32		status;
	bytea	   *body;			/* NULL when the response had none */
	Jsonb	   *headers;		/* NULL when the response had none */
	int32		attempt;
	TimestampTz created_at;
	TimestampTz lease_expires_at;
	TimestampTz expires_at;
	const char *trace;			/* a pending claim's idem.trace to write,
								 * NULL for none; never read back */

	/*
	 * Set by a probe: the version read (its tid on the direct way; the SQL
	 * way recognizes it by the values above), and whether this
	 * transaction's snapshot shows that version
	 */
	ItemPointerData tid;
	bool		visible;
} IdemRecord;

/* What record_probe finds of a key's record */
typedef enum RecordProbe
{
	RECORD_ABSENT,				/* none, and nobody is writing one */
	RECORD_BUSY,				/* another transaction is writing it */
	RECORD_FOUND				/* the newest version */
} RecordProbe;

/* What a write of a probed record did */
typedef enum RecordWrite
{
	RECORD_WRITTEN,
	RECORD_WRITE_BUSY,			/* another transaction holds it */
	RECORD_CHANGED				/* no longer the newest version: probe again */
} RecordWrite;

/* Why a probe that waits for another transaction waits, for its context */
typedef enum RecordIntent
{
	RECORD_FOR_CLAIM,
	RECORD_FOR_FINISH,
	RECORD_FOR_FORGET
} RecordIntent;

extern Oid	record_relation(void);
extern RecordAccess *record_open(RecordAccess *batch);
extern void record_close(RecordAccess *ra);
extern RecordAccess *record_batch_open(void);
extern void record_batch_close(RecordAccess *batch);
extern void record_prepare_write(RecordAccess *ra);
extern bool record_fetch(RecordAccess *ra, const IdemKey *key,
						 IdemRecord *rec);
extern bool record_probe_shows_snapshot(RecordAccess *ra);
extern bool record_may_insert_first(RecordAccess *ra);
extern RecordProbe record_probe(RecordAccess *ra, const IdemKey *key,
								bool wait, RecordIntent intent,
								IdemRecord *rec, bool *own);
extern bool record_busy(RecordAccess *ra, const IdemKey *key);
extern void record_unlock(RecordAccess *ra, const IdemKey *key);
extern bool record_insert_claim(RecordAccess *ra, const IdemKey *key,
								const IdemFingerprint *fp,
								TimestampTz now, TimestampTz lease_expires_at,
								TimestampTz expires_at, const char *trace,
								int32 *attempt);
extern RecordWrite record_write(RecordAccess *ra, const IdemKey *key,
								const IdemRecord *probed,
								const IdemRecord *next, TimestampTz now,
								bool wait);
extern bool record_forget(RecordAccess *ra, const IdemKey *key);
extern List *record_list(RecordAccess *ra, text *tenant, text *endpoint,
						 bool with_body, int32 max_rows, TupleDesc desc);
extern List *record_suspects(RecordAccess *ra, TimestampTz from,
							 Interval *within, text *tenant,
							 TimestampTz now, TupleDesc desc);
extern List *record_purge_targets(RecordAccess *ra, bool *distributed);
extern uint64 record_purge_batch(RecordAccess *ra, Oid target,
								 TimestampTz now, int batch,
								 IdemPurgeScan *scan, bool *more);

#endif							/* IDEM_RECORD_H */
