/*-------------------------------------------------------------------------
 *
 * purge.h
 *	  Deleting expired records and finished messages: purge.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PURGE_H
#define IDEM_PURGE_H

#include "idem.h"

/*
 * One batch of what is purged besides the records: at most batch rows
 * expired by now, *more when the batch was full; activity names it for
 * pg_stat_activity
 */
typedef struct PurgeOther
{
	uint64		(*batch) (TimestampTz now, int batch, bool *more);
	const char *activity;
} PurgeOther;

extern const PurgeOther purge_others[2];

extern List *purge_targets(bool *distributed);
extern uint64 purge_batch(Oid target, TimestampTz now, IdemPurgeScan *scan,
						  bool *more);
extern uint64 purge_all(void);

#endif							/* IDEM_PURGE_H */
