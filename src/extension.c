/*-------------------------------------------------------------------------
 *
 * extension.c
 *	  idem in this database: the extension's schema, and whether its SQL
 *	  objects are ones this library serves.
 *
 * The ground floor: every room that reaches a table of idem's finds the
 * schema here first, and includes no room above it.  The tables' own
 * look-ups (access.c) and their invalidation build on it: the one relcache
 * callback of the library is here, and passes each invalidation on to the
 * rooms that keep something of a table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"

#include "extension.h"

/*
 * The rooms that keep something of a table until it changes: the two
 * tables of access.c's rooms, the plans of the SQL way, the bindings, the
 * freezes.  Core gives all the libraries of a backend ten relcache
 * callbacks (MAX_RELCACHE_CALLBACKS in inval.c), of which Citus takes five
 * and the plan cache one: idem takes one slot, whatever its rooms keep.
 */
#define MAX_LISTENERS	8

typedef struct RelcacheListener
{
	RelcacheCallbackFunction func;
	Datum		arg;
} RelcacheListener;

static RelcacheListener listeners[MAX_LISTENERS];
static int	nlisteners = 0;

/*
 * Whether SQL objects of version version are ones this library serves:
 * IDEM_OLDEST_OBJECTS or later, compared number by number
 */
static bool
objects_served(const char *version)
{
	int			have[3] = {0};
	int			oldest[3] = {0};

	if (sscanf(version, "%d.%d.%d", &have[0], &have[1], &have[2]) != 3 ||
		sscanf(IDEM_OLDEST_OBJECTS, "%d.%d.%d",
			   &oldest[0], &oldest[1], &oldest[2]) != 3)
		return false;
	for (int i = 0; i < 3; i++)
		if (have[i] != oldest[i])
			return have[i] > oldest[i];
	return true;
}

/*
 * The schema of extension "idem", wherever the DBA put it; InvalidOid if
 * it is not installed in this database.  The one place that looks it up,
 * as pg_cron's CronExtensionOwner() reads pg_extension, and so the one
 * place that meets SQL objects older than the library serves (those of
 * 0.1.0, between installing a newer package and ALTER EXTENSION idem
 * UPDATE): every call that reaches a table of idem's looks its tables up
 * through here first (the look-ups are cached per backend, and an update
 * invalidates them), and is refused here, with one SQLSTATE and the hint
 * that mends it, before it reads an argument those objects would not pass
 * or a column they lack.  ALTER EXTENSION sets the new version before it runs
 * an update script, so the script's own calls are served.
 */
Oid
idem_extension_schema(void)
{
	Oid			extoid = get_extension_oid("idem", true);
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			nspid = InvalidOid;
	char	   *version = NULL;

	if (!OidIsValid(extoid))
		return InvalidOid;
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		nspid = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (version != NULL && !objects_served(version))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"idem\" is at version %s in this database, older than this library serves",
						version),
				 errdetail("This library serves the SQL objects of idem %s and later.",
						   IDEM_OLDEST_OBJECTS),
				 errhint("Run ALTER EXTENSION idem UPDATE in this database.")));
	return nspid;
}

static void
relcache_changed(Datum arg, Oid relid)
{
	for (int i = 0; i < nlisteners; i++)
		listeners[i].func(listeners[i].arg, relid);
}

/*
 * Have func(arg, relid) called at each relcache invalidation of this
 * backend, as CacheRegisterRelcacheCallback would; each room calls it once
 * per backend, so that the listeners are a fixed few (an error here is a
 * room registering at every call).
 */
void
idem_on_relcache_change(RelcacheCallbackFunction func, Datum arg)
{
	if (nlisteners == MAX_LISTENERS)
		elog(ERROR, "out of idem relcache listener slots");
	if (nlisteners == 0)
		CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
	listeners[nlisteners].func = func;
	listeners[nlisteners].arg = arg;
	nlisteners++;
}
