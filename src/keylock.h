/*-------------------------------------------------------------------------
 *
 * keylock.h
 *	  The key lock of the SQL way into idem_record: keylock.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYLOCK_H
#define IDEM_KEYLOCK_H

#include "idem.h"

extern bool keylock_acquire(const IdemKey *key, bool wait,
							bool *already_held);
extern bool keylock_held_by_other(const IdemKey *key);
extern uint64 keylock_hash(const IdemKey *key);
extern void keylock_release(const IdemKey *key);

#endif							/* IDEM_KEYLOCK_H */
