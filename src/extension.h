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

extern Oid	idem_extension_schema(void);

#endif							/* IDEM_EXTENSION_H */
