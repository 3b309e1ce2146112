/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  idem's configuration parameters and the retention rule.
 *
 * The rule that matters most: a record must outlive the longest span over
 * which callers retry, or a late retry executes twice.  idem.retention must
 * therefore exceed idem.retry_window.  A configuration that breaks it never
 * stops the server (a database that does not start is an outage for every
 * application on it); instead:
 *
 * - every claim checks the settings in force, and errors (22023) naming
 *   both values while they break the rule, before it writes anything;
 * - when the library is preloaded, the postmaster logs a WARNING naming
 *   both at start, and the purge launcher at every reload;
 * - ALTER SYSTEM, in a backend that has loaded idem, is refused if the
 *   pair that the configuration files would then give breaks the rule: the
 *   other setting's value is read from postgresql.conf and
 *   postgresql.auto.conf, as the next reload or restart will read it.
 *
 * A superuser-only setting (a cap, the binding requirement, the body limit,
 * the decision log) binds every session, preloaded or not.  When idem is
 * loaded only by a session's first call, its settings are placeholders
 * until then, and a value a client gave at connection (or a role's or
 * database's setting, or a SET) of a role that may not set them replaces
 * the configuration file's; defining the variable then refuses that value
 * with a WARNING and falls back to the built-in default, which is no cap.
 * settings_init notices a value so refused, where the configured one is
 * lost with it, and every call that reads that setting then refuses to run
 * (settings_require_readable): a cap the library cannot read is no cap
 * lifted.  Preloaded, the variables exist before any client value, which
 * core then checks as it checks its own.
 *
 * It also pins search_path around the SQL that idem's C code runs
 * (settings_pin_search_path).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "settings.h"

/* The defaults of the retention rule's settings, in seconds */
#define RETENTION_DEFAULT		(24 * 60 * 60)
#define RETRY_WINDOW_DEFAULT	(60 * 60)

int			idem_retention = RETENTION_DEFAULT;
int			idem_retry_window = RETRY_WINDOW_DEFAULT;
int			idem_lease = 5 * 60 * 1000;
int			idem_max_retention = 0;
int			idem_max_lease = 0;
int			idem_purge_interval = 60 * 1000;
int			idem_purge_batch = 10000;
double		idem_purge_pause = 2.0;
int			idem_max_body_size = 1024;
int			idem_log_outcomes = IDEM_LOG_OFF;
char	   *idem_trace = NULL;
bool		idem_standby_replay = false;
bool		idem_require_binding = false;
int			idem_outbox_retention = 7 * 24 * 60 * 60;
int			idem_outbox_max_attempts = 10;
int			idem_outbox_backoff = 1000;
int			idem_outbox_backoff_max = 60 * 60 * 1000;

/* The largest body a bytea can hold, in kilobytes */
#define IDEM_MAX_BODY_KB	((int) (MaxAllocSize / 1024))

static ProcessUtility_hook_type prev_process_utility = NULL;

/* idem.log_outcomes' values; 0.3.0's boolean spellings are kept, hidden */
static const struct config_enum_entry log_outcomes_options[] = {
	{"off", IDEM_LOG_OFF, false},
	{"on", IDEM_LOG_ON, false},
	{"conflicts", IDEM_LOG_CONFLICTS, false},
	{"true", IDEM_LOG_ON, true},
	{"false", IDEM_LOG_OFF, true},
	{"yes", IDEM_LOG_ON, true},
	{"no", IDEM_LOG_OFF, true},
	{"1", IDEM_LOG_ON, true},
	{"0", IDEM_LOG_OFF, true},
	{NULL, 0, false}
};

/* idem.trace: as long as a key may be */
static bool
check_trace(char **newval, void **extra, GucSource source)
{
	if (*newval != NULL && strlen(*newval) > IDEM_MAX_KEY_BYTES)
	{
		GUC_check_errdetail("idem.trace is at most %d bytes long.",
							IDEM_MAX_KEY_BYTES);
		return false;
	}
	return true;
}

/* A superuser-only setting whose configured value was lost, if any */
static char *unreadable = NULL;

/* A placeholder of idem's, as it stood before the variables were defined */
typedef struct Placeholder
{
	char	   *name;
	GucSource	reset_source;
} Placeholder;

/* The placeholders of idem's settings that hold a reset value, into *n */
static Placeholder *
placeholders(int *n)
{
	int			nvars;
	struct config_generic **vars = idem_guc_variables(&nvars);
	Placeholder *found = palloc(sizeof(Placeholder) * Max(nvars, 1));

	*n = 0;
	for (int i = 0; i < nvars; i++)
		if ((vars[i]->flags & GUC_CUSTOM_PLACEHOLDER) &&
			pg_strncasecmp(vars[i]->name, "idem.", 5) == 0 &&
			vars[i]->reset_source != PGC_S_DEFAULT)
		{
			found[*n].name = pstrdup(vars[i]->name);
			found[*n].reset_source = vars[i]->reset_source;
			(*n)++;
		}
	return found;
}

/*
 * After the variables are defined: a superuser-only one whose placeholder
 * held a reset value (what RESET returns to: the configuration file's, or
 * whatever replaced it at connection) and that now holds none lost it to a
 * refusal, and with it whatever the configuration files said.  A refused
 * current value alone (a SET before the first call) leaves the reset value
 * in force: nothing is lost.
 */
static void
notice_refused(const Placeholder *held, int n)
{
	int			nvars;
	struct config_generic **vars = idem_guc_variables(&nvars);

	for (int i = 0; i < nvars && unreadable == NULL; i++)
	{
		if (vars[i]->context != PGC_SUSET ||
			pg_strncasecmp(vars[i]->name, "idem.", 5) != 0)
			continue;
		for (int p = 0; p < n; p++)
			if (pg_strcasecmp(held[p].name, vars[i]->name) == 0 &&
				held[p].reset_source != PGC_S_DEFAULT &&
				vars[i]->reset_source == PGC_S_DEFAULT)
				unreadable = MemoryContextStrdup(TopMemoryContext,
												 vars[i]->name);
	}
}

/*
 * Refuse to run while a superuser-only setting's configured value is
 * unknown (see the file's header)
 */
void
settings_require_readable(void)
{
	if (unlikely(unreadable != NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("idem cannot read the configured value of \"%s\"", unreadable),
				 errdetail("A value given by a role that may not set \"%s\" (a connection option, a role or database setting, or SET) replaced it before idem was loaded, and was refused.",
						   unreadable),
				 errhint("Set \"%s\" only as a superuser, or add idem to shared_preload_libraries.",
						 unreadable)));
}

void
settings_init(void)
{
	int			nheld;
	Placeholder *held = placeholders(&nheld);

	DefineCustomIntVariable("idem.retention",
							"How long a record is remembered after its claim.",
							"Must be longer than idem.retry_window.",
							&idem_retention,
							RETENTION_DEFAULT, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.retry_window",
							"The longest span over which callers retry a request.",
							"Must be shorter than idem.retention.",
							&idem_retry_window,
							RETRY_WINDOW_DEFAULT, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.lease",
							"How long a committed pending claim answers in_progress before it answers unknown.",
							NULL,
							&idem_lease,
							5 * 60 * 1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_retention",
							"Sets the longest retention a claim may give its record.",
							"0 means no limit.  A claim asking for more, by argument or setting, errors.",
							&idem_max_retention,
							0, 0, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_lease",
							"Sets the longest lease a claim may take.",
							"0 means no limit.  A claim asking for more, by argument or setting, errors.",
							&idem_max_lease,
							0, 0, INT_MAX,
							PGC_SUSET,
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

	DefineCustomRealVariable("idem.purge_pause",
							 "How long the background purge pauses, as a multiple of its batches' time.",
							 "0 runs the batches back to back; 2 keeps the purge busy about a third of the time.",
							 &idem_purge_pause,
							 2.0, 0.0, 100.0,
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

	DefineCustomEnumVariable("idem.log_outcomes",
							 "Logs one line per decision: off, on, or only the conflicts.",
							 "conflicts logs a claim's in_progress, mismatch and unknown and an enqueue's mismatch.",
							 &idem_log_outcomes,
							 IDEM_LOG_OFF,
							 log_outcomes_options,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("idem.trace",
							   "The trace id of this transaction's request, stored by an executing claim and an enqueue and logged with each decision.",
							   "At most 255 bytes; set it with SET LOCAL.",
							   &idem_trace,
							   "",
							   PGC_USERSET,
							   0,
							   check_trace, NULL, NULL);

	DefineCustomBoolVariable("idem.standby_replay",
							 "Lets idem_replay answer on a standby or a logical-replication subscriber of idem_record, from data that may lag the primary.",
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

	DefineCustomIntVariable("idem.outbox_retention",
							"Sets how long a delivered or dead outbox message is kept after it finished.",
							NULL,
							&idem_outbox_retention,
							7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_max_attempts",
							"Sets how many attempts an outbox message gets before it is dead.",
							"An enqueue's max_attempts argument overrides it for its message.",
							&idem_outbox_max_attempts,
							10, 1, INT_MAX,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_backoff",
							"Sets the wait after an outbox message's first failed attempt.",
							"It doubles with each further failure, up to idem.outbox_backoff_max; the wait is jittered between half of that and all of it.",
							&idem_outbox_backoff,
							1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_backoff_max",
							"Sets the longest wait between two attempts of an outbox message.",
							NULL,
							&idem_outbox_backoff_max,
							60 * 60 * 1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	notice_refused(held, nheld);

	/*
	 * Reserving the prefix also removes idem.tenant, the binding setting of
	 * idem 0.1.0, where roles still have it: logins then only warn.
	 */
	MarkGUCPrefixReserved("idem");
}

/*
 * The one report of the retention rule broken: in force (after_alter
 * false), or in the configuration files once an ALTER SYSTEM would have
 * run.
 */
static void
report_retention_rule(int elevel, int retention, int retry_window,
					  bool after_alter)
{
	ereport(elevel,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("idem.retention (%ds) must be longer than idem.retry_window (%ds)",
					retention, retry_window),
			 after_alter ?
			 errdetail("After this ALTER SYSTEM, the configuration files would set idem.retention to %ds and idem.retry_window to %ds.",
					   retention, retry_window) :
			 errdetail("A retry that arrives after its record expired would execute the request again."),
			 after_alter ?
			 errhint("To move both settings past each other, change first the one that keeps the rule.") :
			 errhint("Raise idem.retention or lower idem.retry_window.")));
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

	report_retention_rule(elevel, idem_retention, idem_retry_window, false);
}

/* The two settings of the retention rule, as one configuration gives them */
typedef struct RulePair
{
	char	   *retention;		/* NULL: not set there */
	char	   *retry_window;
} RulePair;

/* Collect the rule's settings that a configuration file sets, last wins */
static void
read_rule_pair(const char *file, RulePair *pair)
{
	ConfigVariable *head = NULL;
	ConfigVariable *tail = NULL;

	(void) ParseConfigFile(file, false, NULL, 0, 0, DEBUG1, &head, &tail);
	for (ConfigVariable *item = head; item != NULL; item = item->next)
	{
		if (pg_strcasecmp(item->name, "idem.retention") == 0)
			pair->retention = pstrdup(item->value);
		else if (pg_strcasecmp(item->name, "idem.retry_window") == 0)
			pair->retry_window = pstrdup(item->value);
	}
	FreeConfigVariables(head);
}

/* A value in seconds, or the default when it is not set or not valid */
static int
rule_seconds(const char *value, int boot_value)
{
	int			seconds;

	if (value == NULL || !parse_int(value, &seconds, GUC_UNIT_S, NULL))
		return boot_value;
	return seconds;
}

/*
 * Refuse an ALTER SYSTEM after which the configuration files would give a
 * retention that does not outlive the retry window.  The pair is what
 * postgresql.conf (with its includes) and then postgresql.auto.conf give,
 * with the statement's change applied to the latter: so two ALTER SYSTEM
 * commands without a reload between them are checked against each other.
 * Settings from the command line or ALTER DATABASE/ROLE are not seen here;
 * claims check whatever is in force.
 */
static void
check_alter_system(AlterSystemStmt *stmt)
{
	VariableSetStmt *set = stmt->setstmt;
	bool		all = set->kind == VAR_RESET_ALL;
	bool		is_retention = !all &&
		pg_strcasecmp(set->name, "idem.retention") == 0;
	bool		is_window = !all &&
		pg_strcasecmp(set->name, "idem.retry_window") == 0;
	RulePair	conf = {NULL, NULL};
	RulePair	autoconf = {NULL, NULL};
	char	   *value = NULL;
	int			retention;
	int			retry_window;

	if (!all && !is_retention && !is_window)
		return;

	read_rule_pair(ConfigFileName, &conf);
	if (!all)
		read_rule_pair(PG_AUTOCONF_FILENAME, &autoconf);
	if (set->kind == VAR_SET_VALUE)
	{
		int			seconds;

		value = ExtractSetVariableArgs(set);
		/* an invalid value is core's to report, with its own message */
		if (value == NULL || !parse_int(value, &seconds, GUC_UNIT_S, NULL))
			return;
	}

	/* RESET and SET DEFAULT drop the line from postgresql.auto.conf */
	if (is_retention)
		autoconf.retention = value;
	else if (is_window)
		autoconf.retry_window = value;

	retention = rule_seconds(autoconf.retention ? autoconf.retention :
							 conf.retention, RETENTION_DEFAULT);
	retry_window = rule_seconds(autoconf.retry_window ? autoconf.retry_window :
								conf.retry_window, RETRY_WINDOW_DEFAULT);
	if (retention > retry_window)
		return;
	report_retention_rule(ERROR, retention, retry_window, true);
}

static void
idem_process_utility(PlannedStmt *pstmt, const char *queryString,
					 bool readOnlyTree, ProcessUtilityContext context,
					 ParamListInfo params, QueryEnvironment *queryEnv,
					 DestReceiver *dest, QueryCompletion *qc)
{
	if (IsA(pstmt->utilityStmt, AlterSystemStmt))
		check_alter_system((AlterSystemStmt *) pstmt->utilityStmt);
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * Check ALTER SYSTEM in every backend that loads idem: all of them when it
 * is preloaded.
 */
void
settings_guard_alter_system(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = idem_process_utility;
}

/*
 * Set search_path to "pg_catalog, <schema>, pg_temp" (without a schema:
 * "pg_catalog, pg_temp") for the SQL that idem's C code runs on a caller's
 * behalf, until AtEOXact_GUC() with the nest level returned (which also
 * undoes other settings made at that level).  idem's C functions carry no SET clause: one would cost every
 * call, and most calls run no SQL at all (record.c reaches the table
 * directly), a change of search_path and back.  The statements name their
 * objects with their schemas anyway; the pin keeps anything a caller's
 * path holds (pg_temp first, say) out of the few names that cannot be
 * qualified, such as the shard names Citus gives back.  An error in
 * between gives the caller's path back with the (sub)transaction's abort.
 */
int
settings_pin_search_path(Oid schema)
{
	char	   *name = OidIsValid(schema) ? get_namespace_name(schema) : NULL;
	char	   *path;
	int			nestlevel;

	if (OidIsValid(schema) && name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("schema of extension \"idem\" does not exist"),
				 errdetail("The extension was dropped while this call ran.")));
	path = name != NULL ?
		psprintf("pg_catalog, %s, pg_temp", quote_identifier(name)) :
		pstrdup("pg_catalog, pg_temp");
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", path, PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	pfree(path);
	return nestlevel;
}
