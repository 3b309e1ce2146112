/*-------------------------------------------------------------------------
 *
 * subscription.h
 *	  Which logical-replication subscription receives a table of idem's:
 *	  subscription.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SUBSCRIPTION_H
#define IDEM_SUBSCRIPTION_H

#include "idem.h"

extern Oid	subscription_of_records(void);
extern Oid	subscription_of(Oid relid);

#endif							/* IDEM_SUBSCRIPTION_H */
