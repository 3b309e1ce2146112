/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  Claim, finish, replay, list and forget as decisions over a record's
 *	  state, and the checks every decision makes first: protocol.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PROTOCOL_H
#define IDEM_PROTOCOL_H

#include "idem.h"

typedef struct ProtocolBatch ProtocolBatch;
extern void protocol_claim(ProtocolBatch *batch, const IdemKey *key,
						   const IdemFingerprint *fp, bool wait,
						   Interval *lease, Interval *retention,
						   Interval *wait_timeout, IdemAnswer *answer);
extern bool protocol_replay(const IdemKey *key, const IdemFingerprint *fp,
							IdemAnswer *answer);
extern bool protocol_finish(ProtocolBatch *batch, const IdemKey *key,
							IdemFinish how, bool has_attempt, int32 attempt,
							bool has_status, int32 status, bytea *body,
							Jsonb *headers);
extern List *protocol_suspects(Interval *since, Interval *within,
							   text *tenant, TupleDesc desc);
extern List *protocol_list(text *tenant, text *endpoint, bool with_body,
						   int32 max_rows, TupleDesc desc);
extern bool protocol_forget(const IdemKey *key);
extern ProtocolBatch *protocol_batch_begin(void);
extern void protocol_batch_next(ProtocolBatch *batch);
extern void protocol_batch_end(ProtocolBatch *batch);
extern const char *outcome_name(IdemOutcome outcome);
extern void require_primary(const char *function);
extern void require_primary_for(const char *function, Oid relid,
								const char *table);
extern TimestampTz protocol_lease_end(const char *who, TimestampTz now,
									  Interval *lease);
extern TimestampTz protocol_time_plus(TimestampTz now, Interval *span,
									  const char *name);
extern void protocol_check_cap(const char *who, const char *what,
							   TimestampTz now, TimestampTz end, int64 cap_us,
							   Interval *given, const char *setting,
							   const char *cap_setting);

#endif							/* IDEM_PROTOCOL_H */
