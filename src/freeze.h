/*-------------------------------------------------------------------------
 *
 * freeze.h
 *	  Frozen entry points (idem_freeze, idem_thaw, idem_frozen): freeze.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_FREEZE_H
#define IDEM_FREEZE_H

#include "idem.h"

extern bool freeze_holds(const IdemKey *key, TimestampTz now);

#endif							/* IDEM_FREEZE_H */
