/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  What the rest of idem asks of the outbox (outbox.c): its table, and
 *	  its purge.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

#include "idem.h"

extern Oid	outbox_relation(void);
extern uint64 outbox_purge_batch(TimestampTz now, int batch, bool *more);

#endif							/* IDEM_OUTBOX_H */
