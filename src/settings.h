/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  The settings (GUCs), the retention rule and the pinned search_path:
 *	  settings.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SETTINGS_H
#define IDEM_SETTINGS_H

#include "idem.h"

extern int	idem_retention;		/* seconds */
extern int	idem_retry_window;	/* seconds */
extern int	idem_lease;			/* milliseconds */
extern int	idem_max_retention; /* seconds, 0: no cap */
extern int	idem_max_lease;		/* milliseconds, 0: no cap */
extern int	idem_purge_interval;	/* milliseconds */
extern int	idem_purge_batch;	/* rows */
extern double idem_purge_pause;	/* multiple of a batch's time */
extern int	idem_max_body_size; /* kilobytes */
/* idem.log_outcomes: which decisions get a LOG line (decisions.c) */
typedef enum IdemLogOutcomes
{
	IDEM_LOG_OFF,
	IDEM_LOG_ON,
	IDEM_LOG_CONFLICTS
} IdemLogOutcomes;

extern int	idem_log_outcomes;
extern char *idem_trace;		/* "" when not set */
extern bool idem_standby_replay;
extern bool idem_require_binding;
extern int	idem_outbox_retention;	/* seconds */
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_backoff;	/* milliseconds */
extern int	idem_outbox_backoff_max;	/* milliseconds */
extern void settings_init(void);
extern void settings_require_readable(void);
extern void settings_check_retention_rule(int elevel);
extern void settings_guard_alter_system(void);
extern int	settings_pin_search_path(Oid schema);

#endif							/* IDEM_SETTINGS_H */
