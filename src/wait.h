/*-------------------------------------------------------------------------
 *
 * wait.h
 *	  A claim's wait for a committed pending claim to finish: wait.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WAIT_H
#define IDEM_WAIT_H

#include "idem.h"

/*
 * A claim's wait for a committed pending claim of its key: the wake-up
 * slot's generation when it last looked (with idem preloaded), or the next
 * poll's sleep (without); when lock_timeout ends the wait, from its
 * first sleep on, and when it next looks for a deadlock
 */
typedef struct IdemWait
{
	uint64		generation;
	long		poll_ms;
	bool		slept;			/* the deadlines are set */
	TimestampTz lock_deadline;
	TimestampTz deadlock_check; /* when to look for a deadlock next */
} IdemWait;

extern void wait_shmem_request(void);
extern void wait_shmem_startup(void);
extern void wait_key_finished(const IdemKey *key);
extern void wait_prepare(const IdemKey *key, IdemWait *w);
extern void wait_sleep(const IdemKey *key, TimestampTz until, IdemWait *w);

#endif							/* IDEM_WAIT_H */
