/*-------------------------------------------------------------------------
 *
 * subscription.c
 *	  Whether a logical-replication subscription receives idem_record.
 *
 * A database whose idem_record is a table of one of its subscriptions (a
 * publication FOR ALL TABLES, or one that names the table) holds the
 * publisher's records: the publisher decides, and its claims, finishes and
 * deletions arrive through the apply worker.  A decision taken here as
 * well would write a key the publisher writes too, and the apply worker
 * would stop on the unique index until the subscription is dropped.  So
 * idem decides nothing there (require_primary), and its purge worker
 * leaves the records to the publisher's purge.  The apply worker itself
 * calls no idem function; it writes the rows directly.
 *
 * pg_subscription_rel lists, per database, every table of every
 * subscription of that database, whatever the state of its
 * synchronisation.  The answer is asked for by every decision, so it is
 * cached per backend and thrown away when pg_subscription_rel changes (a
 * syscache invalidation of SUBSCRIPTIONRELMAP, sent by CREATE, ALTER ...
 * REFRESH and DROP SUBSCRIPTION and by every change of a table's
 * synchronisation state), or when idem_record is another table than the
 * one the answer was for (the extension dropped and created again).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_subscription_rel.h"
#include "utils/catcache.h"
#include "utils/inval.h"
#include "utils/syscache.h"

#include "record.h"
#include "subscription.h"

static bool callback_registered = false;
static bool cache_valid = false;
static Oid	cached_relid = InvalidOid;	/* the idem_record of the answer */
static Oid	cached_subid = InvalidOid;	/* the answer */

static void
subscriptions_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	cache_valid = false;
}

/*
 * The OID of a subscription of this database that receives idem_record,
 * InvalidOid when none does.  An invalidation that arrives during the
 * look-up (reading the catalog processes pending ones) leaves the answer,
 * correct for this call, uncached.
 */
Oid
subscription_of_records(void)
{
	Oid			relid = record_relation();

	if (!callback_registered)
	{
		CacheRegisterSyscacheCallback(SUBSCRIPTIONRELMAP,
									  subscriptions_changed, (Datum) 0);
		callback_registered = true;
	}
	if (cache_valid && cached_relid == relid)
		return cached_subid;

	cache_valid = true;
	cached_relid = relid;
	cached_subid = subscription_of(relid);
	return cached_subid;
}

/*
 * The subscription (one of them) that receives table relid into this
 * database, or InvalidOid; not cached.  tenant.c asks it of idem_binding:
 * a subscribed binding table changes through the apply worker, which
 * fires no statement trigger, so its changes invalidate no cache.
 */
Oid
subscription_of(Oid relid)
{
	CatCList   *list;
	Oid			subid = InvalidOid;

	list = SearchSysCacheList1(SUBSCRIPTIONRELMAP, ObjectIdGetDatum(relid));
	if (list->n_members > 0)
		subid = ((Form_pg_subscription_rel)
				 GETSTRUCT(&list->members[0]->tuple))->srsubid;
	ReleaseSysCacheList(list);
	return subid;
}
