/*-------------------------------------------------------------------------
 *
 * decisions.h
 *	  The log line of a decision (idem.log_outcomes, idem.trace):
 *	  decisions.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DECISIONS_H
#define IDEM_DECISIONS_H

#include "idem.h"

extern bool decisions_logged(bool conflict);
extern void decisions_log(const char *decision, const IdemKey *key,
						  const char *scope, const char *fmt,...)
			pg_attribute_printf(4, 5);

#endif							/* IDEM_DECISIONS_H */
