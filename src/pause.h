/*-------------------------------------------------------------------------
 *
 * pause.h
 *	  Paused outbox topics (idem_pause, idem_resume): pause.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PAUSE_H
#define IDEM_PAUSE_H

#include "idem.h"

extern List *pause_tenants(text *topic, bool *all);
extern bool pause_holds(List *paused, text *tenant);

#endif							/* IDEM_PAUSE_H */
