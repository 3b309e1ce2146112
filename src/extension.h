/*-------------------------------------------------------------------------
 *
 * extension.h
 *	  idem in this database: extension.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EXTENSION_H
#define IDEM_EXTENSION_H

#include "idem.h"

#include "utils/inval.h"

extern Oid	idem_extension_schema(void);
extern void idem_on_relcache_change(RelcacheCallbackFunction func, Datum arg);

#endif							/* IDEM_EXTENSION_H */
