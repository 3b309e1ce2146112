/*-------------------------------------------------------------------------
 *
 * tenant.h
 *	  The tenant binding, and the extension's schema: tenant.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TENANT_H
#define IDEM_TENANT_H

#include "idem.h"

extern void tenant_check(const text *tenant);
extern text *tenant_bound(void);

#endif							/* IDEM_TENANT_H */
