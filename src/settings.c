/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  idem's configuration parameters and the retention rule.
 *
 * The rule that matters most: a record must outlive the longest span over
 * which callers retry, or a late retry executes twice.  idem.retention must
 * therefore exceed idem.retry_window.  It is checked in three places:
 *
 * - when the library is preloaded, once both settings hold the
 *   configuration's values: the server refuses to start;
 * - in check hooks, for values from the configuration file (a reload, or
 *   ALTER SYSTEM): a value that would break the rule against the other
 *   setting's value in force is refused, logged, and the old one stays, so
 *   the rule holds after every step of a reload;
 * - at every claim, since a session or a role may set both (the claim
 *   errors).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "utils/guc.h"
#include "utils/memutils.h"

#include "idem.h"

int			idem_retention = 24 * 60 * 60;
int			idem_retry_window = 60 * 60;
int			idem_lease = 5 * 60 * 1000;
int			idem_purge_interval = 60 * 1000;
int			idem_purge_batch = 10000;
int			idem_max_body_size = 1024;
bool		idem_log_outcomes = false;
bool		idem_standby_replay = false;
bool		idem_require_binding = false;

/* Both settings of the retention rule exist: the check hooks may compare */
static bool settings_defined = false;

/* The largest body a bytea can hold, in kilobytes */
#define IDEM_MAX_BODY_KB	((int) (MaxAllocSize / 1024))

static bool
check_retention_rule(int retention, int retry_window, GucSource source)
{
	if (!settings_defined || source != PGC_S_FILE || retention > retry_window)
		return true;
	GUC_check_errdetail("idem.retention (%ds) must be longer than idem.retry_window (%ds).",
						retention, retry_window);
	GUC_check_errhint("The value in force stays.  To move both settings past each other, change them in two steps.");
	return false;
}

static bool
check_retention(int *newval, void **extra, GucSource source)
{
	return check_retention_rule(*newval, idem_retry_window, source);
}

static bool
check_retry_window(int *newval, void **extra, GucSource source)
{
	return check_retention_rule(idem_retention, *newval, source);
}

void
settings_init(void)
{
	DefineCustomIntVariable("idem.retention",
							"How long a record is remembered after its claim.",
							"Must be longer than idem.retry_window.",
							&idem_retention,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							check_retention, NULL, NULL);

	DefineCustomIntVariable("idem.retry_window",
							"The longest span over which callers retry a request.",
							"Must be shorter than idem.retention.",
							&idem_retry_window,
							60 * 60, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							check_retry_window, NULL, NULL);

	DefineCustomIntVariable("idem.lease",
							"How long a committed pending claim answers in_progress before it answers unknown.",
							NULL,
							&idem_lease,
							5 * 60 * 1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.purge_interval",
							"Time between two purges of expired records by the background worker.",
							NULL,
							&idem_purge_interval,
							60 * 1000, 10, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.purge_batch",
							"How many expired records one purge transaction deletes.",
							NULL,
							&idem_purge_batch,
							10000, 1, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_body_size",
							"The largest response body a record stores.",
							NULL,
							&idem_max_body_size,
							1024, 0, IDEM_MAX_BODY_KB,
							PGC_SUSET,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.log_outcomes",
							 "Logs one line per claim: tenant, endpoint, key, outcome and attempt.",
							 NULL,
							 &idem_log_outcomes,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.standby_replay",
							 "Lets idem_replay answer on a standby, from data that may lag the primary.",
							 "Claims and every other decision always need the primary.",
							 &idem_standby_replay,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.require_binding",
							 "Refuses every tenant to a non-superuser role bound to none.",
							 "Bind roles to tenants with idem_bind().",
							 &idem_require_binding,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	settings_defined = true;

	/*
	 * Reserving the prefix also removes idem.tenant, the binding setting of
	 * idem 0.1.0, where roles still have it: logins then only warn.
	 */
	MarkGUCPrefixReserved("idem");
}

/*
 * Report, at elevel, a retention that does not outlive the retry window.
 * The message names both settings and their values so that whoever reads
 * the log knows what to change.
 */
void
settings_check_retention_rule(int elevel)
{
	if (idem_retention > idem_retry_window)
		return;

	ereport(elevel,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("idem.retention (%ds) must be longer than idem.retry_window (%ds)",
					idem_retention, idem_retry_window),
			 errdetail("A retry that arrives after its record expired would execute the request again."),
			 errhint("Raise idem.retention or lower idem.retry_window.")));
}
