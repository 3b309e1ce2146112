/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module initialization: settings, and, when preloaded, the retention
 *	  rule at startup, the shared-memory counters, the wake-up slots of
 *	  waiting claims and the purge launcher.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "idem.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Without shared_preload_libraries, idem only defines its settings: every
 * SQL function works, idem_purge() purges on demand, and the counters stay
 * off.  Preloaded, a configuration that breaks the retention rule stops the
 * server from starting (an error in the postmaster is fatal, and the log
 * names both settings).
 */
void
_PG_init(void)
{
	settings_init();
	if (!process_shared_preload_libraries_in_progress)
		return;
	settings_check_retention_rule(ERROR);
	stats_init();
	wait_init();
	worker_register_launcher();
}
