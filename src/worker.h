/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The purge worker's registration: worker.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

#include "idem.h"

extern void worker_register_launcher(void);

#endif							/* IDEM_WORKER_H */
