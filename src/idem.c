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
#include "storage/ipc.h"

#include "idem.h"
#include "settings.h"
#include "stats.h"
#include "wait.h"
#include "worker.h"

PG_MODULE_MAGIC;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* The shared memory of the counters and of the wake-up slots */
static void
idem_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	stats_shmem_request();
	wait_shmem_request();
}

static void
idem_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	stats_shmem_startup();
	wait_shmem_startup();
}

/*
 * Without shared_preload_libraries, idem only defines its settings and
 * checks ALTER SYSTEM in the sessions that load it: every SQL function
 * works, idem_purge() purges on demand, and the counters stay off.
 * Preloaded, a configuration that breaks the retention rule is logged as a
 * WARNING naming both settings; the server starts, and claims error until
 * the configuration is fixed.
 */
void
_PG_init(void)
{
	settings_init();
	settings_guard_alter_system();
	if (!process_shared_preload_libraries_in_progress)
		return;
	settings_check_retention_rule(WARNING);
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idem_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = idem_shmem_startup;
	worker_register_launcher();
}
