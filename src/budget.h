/*-------------------------------------------------------------------------
 *
 * budget.h
 *	  What the purge asks of the retry budgets (budget.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_BUDGET_H
#define IDEM_BUDGET_H

#include "idem.h"

extern uint64 budget_purge_batch(TimestampTz now, int batch, bool *more);

#endif							/* IDEM_BUDGET_H */
