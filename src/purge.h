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

extern List *purge_targets(bool *distributed);
extern uint64 purge_batch(Oid target, TimestampTz now, IdemPurgeScan *scan,
						  bool *more);
extern uint64 purge_all(void);

#endif							/* IDEM_PURGE_H */
