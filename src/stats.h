/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  The shared-memory counters: stats.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

#include "idem.h"

extern void stats_shmem_request(void);
extern void stats_shmem_startup(void);
extern void stats_count_claim(IdemOutcome outcome);
extern void stats_count_finish(IdemFinish how);
extern void stats_count_purge(uint64 rows, TimestampTz start, TimestampTz end,
							  bool backlog, long owed_ms);
extern void stats_clear_purge_backlog(Oid dbid);
extern bool stats_purge_backlog(Oid dbid, long *owed_ms);

#endif							/* IDEM_STATS_H */
