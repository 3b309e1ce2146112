/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module initialization: settings, and the retention rule at startup.
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
 * With the library in shared_preload_libraries, a configuration that breaks
 * the retention rule stops the server from starting: an error here, in the
 * postmaster, is fatal, and the log names both settings.
 */
void
_PG_init(void)
{
	settings_init();
	if (process_shared_preload_libraries_in_progress)
		settings_check_retention_rule(ERROR);
}
