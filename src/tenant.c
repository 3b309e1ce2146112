/*-------------------------------------------------------------------------
 *
 * tenant.c
 *	  The tenant binding: which tenant a role may touch.
 *
 * Replaying one tenant's response to another is a data leak.  A superuser
 * binds a role to its tenant with idem_bind(role, tenant); the bindings are
 * rows of the extension's table idem_binding, in the database, dumped with
 * it.  Nothing a session can set changes them: no setting, no connection
 * option, no preload.
 *
 * A call acts on behalf of up to three roles: the session user, the role
 * chosen by SET ROLE, and the current user (the owner of the innermost
 * security definer function).  A role is bound by its own binding and by
 * those of every role whose privileges it has, as PostgreSQL counts them
 * (membership with INHERIT, directly or indirectly; a superuser's
 * privileges over every role do not count).  A member that does not
 * inherit is bound once it uses SET ROLE.  Every bound role among the three
 * restricts the call to its tenant, so neither SET ROLE to another role
 * nor a security definer function of an unbound role lifts a binding, and a
 * security definer function of a bound role is bound even for an unbound
 * caller.  Bindings that name different tenants leave no tenant at all.  A
 * call that no binding restricts may touch every tenant, unless
 * idem.require_binding is on and the current user is not a superuser.
 *
 * The answer per role is cached for the backend's life and thrown away when
 * idem_binding changes (a statement trigger on it sends a relcache
 * invalidation, which every backend processes before its next transaction
 * or lock) or when role memberships change.  The trigger is enabled ALWAYS,
 * so that it fires in a session with session_replication_role = replica
 * too (a migration tool, a restore); the cache is kept only while it is:
 * disabled, or firing for origin sessions only (as ALTER TABLE ... ENABLE
 * TRIGGER ALL after pg_restore --disable-triggers leaves it), it could miss
 * a change, so every call reads the table instead.  Changing the trigger's
 * state invalidates the table's relcache entry, so the check is made again.
 * Nor is it kept while a logical-replication subscription receives
 * idem_binding: the apply worker fires no statement trigger, so the changes
 * it applies would reach no cache; a change of pg_subscription_rel (CREATE,
 * ALTER ... REFRESH, DROP SUBSCRIPTION) makes the check be made again.
 * When the bindings cannot be read, every call is refused: a missing answer
 * never means "unbound".
 *
 * The same answer drives idem_record's row-level security policy through
 * idem_tenant().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/sinval.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/varlena.h"

#include "extension.h"
#include "settings.h"
#include "subscription.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_bind);
PG_FUNCTION_INFO_V1(idem_unbind);
PG_FUNCTION_INFO_V1(idem_tenant);
PG_FUNCTION_INFO_V1(idem_binding_changed);
PG_FUNCTION_INFO_V1(idem_role_in);
PG_FUNCTION_INFO_V1(idem_role_out);
PG_FUNCTION_INFO_V1(idem_binding_unknown_role);

/* What the bindings say about one role */
typedef enum BindingKind
{
	BINDING_NONE,				/* no binding applies to it */
	BINDING_ONE,				/* bound to exactly one tenant */
	BINDING_CONFLICT			/* bound to several tenants */
} BindingKind;

typedef struct RoleBinding
{
	Oid			roleid;			/* hash key */
	BindingKind kind;
	int			len;			/* of tenant, for BINDING_ONE */
	char		tenant[IDEM_MAX_KEY_BYTES + 1];
	char		other[IDEM_MAX_KEY_BYTES + 1];	/* for BINDING_CONFLICT */
} RoleBinding;

/* The tenant a call may touch, from the roles it acts as */
typedef struct Restriction
{
	bool		restricted;
	RoleBinding by;				/* the binding that restricts, if any */
	Oid			by_role;
} Restriction;

static HTAB *binding_cache = NULL;
static bool cache_valid = false;
static bool callbacks_registered = false;
static Oid	binding_relid = InvalidOid;
static bool cache_trusted = false;	/* every change of binding_relid
										 * invalidates the cache */

static void
binding_relcache_changed(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == binding_relid)
	{
		cache_valid = false;
		binding_relid = InvalidOid;
	}
}

static void
binding_roles_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	cache_valid = false;
}

/* A subscription took idem_binding in or let it go: trust it again or not */
static void
binding_subscriptions_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	cache_valid = false;
	binding_relid = InvalidOid;
}

/*
 * The OID of the extension's binding table, or InvalidOid when this
 * database has none that idem can trust: the extension is not installed,
 * or the table is not the extension's own, with the columns (role
 * idem_role, tenant text).  (SQL objects older than the library serves are
 * refused before, by idem_extension_schema.)  The
 * role column of 0.2.0 (regrole) is accepted too: the values are the same
 * OIDs, so a database not yet updated keeps its bindings.
 */
static Oid
find_binding_relation(void)
{
	Oid			nspid = idem_extension_schema();
	Oid			relid;
	Oid			extoid;
	Oid			roletype;

	if (!OidIsValid(nspid))
		return InvalidOid;
	relid = get_relname_relid("idem_binding", nspid);
	if (!OidIsValid(relid))
		return InvalidOid;
	extoid = get_extension_oid("idem", true);
	roletype = get_atttype(relid, 1);
	if (getExtensionOfObject(RelationRelationId, relid) != extoid ||
		(roletype != REGROLEOID &&
		 (roletype != GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
									  CStringGetDatum("idem_role"),
									  ObjectIdGetDatum(nspid)) ||
		  getExtensionOfObject(TypeRelationId, roletype) != extoid)) ||
		get_atttype(relid, 2) != TEXTOID)
		return InvalidOid;
	return relid;
}

/*
 * Whether every change to the binding table relid invalidates the caches,
 * whatever the changing session's settings: its trigger idem_binding_changed
 * calls the extension's function after every INSERT, UPDATE, DELETE and
 * TRUNCATE statement, with no condition, and is enabled ALWAYS.  Opening
 * the table processes pending invalidations: the caller then looks again if
 * any message arrived.  The catalog look-ups below may process an
 * invalidation of the table too (an idem_bind or idem_unbind committing
 * meanwhile), and a rebuild of its relcache entry frees the trigger
 * descriptor: so the loop reads a copy, as the executor does.
 */
static bool
binding_trigger_fires_always(Oid relid)
{
	Relation	rel = try_table_open(relid, AccessShareLock);
	TriggerDesc *trigdesc;
	bool		always = false;

	if (rel == NULL)
		return false;
	trigdesc = CopyTriggerDesc(rel->trigdesc);
	for (int i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];
		char	   *fname;

		if (strcmp(trigger->tgname, "idem_binding_changed") != 0)
			continue;
		fname = get_func_name(trigger->tgfoid);
		always = trigger->tgenabled == TRIGGER_FIRES_ALWAYS &&
			trigger->tgtype == TRIGGER_TYPE_EVENT_MASK &&
			trigger->tgnattr == 0 && trigger->tgqual == NULL &&
			fname != NULL && strcmp(fname, "idem_binding_changed") == 0 &&
			getExtensionOfObject(ProcedureRelationId, trigger->tgfoid) ==
			get_extension_oid("idem", true);
	}
	if (trigdesc != NULL)
		FreeTriggerDesc(trigdesc);
	table_close(rel, AccessShareLock);
	return always;
}

pg_noreturn static void
refuse_undetermined(const char *tenant)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 tenant ?
			 errmsg("permission denied for idem tenant \"%s\"", tenant) :
			 errmsg("permission denied for idem tenants"),
			 errdetail("The tenant bindings of extension \"idem\" cannot be read in this database."),
			 errhint("Make sure that \"ALTER EXTENSION idem UPDATE\" was run in this database.")));
}

/*
 * Read the bindings that apply to roleid from idem_binding: its own and
 * those of every role whose privileges it inherits.  The table is read directly, not
 * through SQL, so no privilege, policy or search_path of the caller plays a
 * part, with the latest snapshot, so a binding committed before this call
 * holds in it.
 */
static void
read_binding(Oid relid, Oid roleid, RoleBinding *entry, const char *tenant)
{
	Relation	rel;
	Snapshot	snapshot;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		is_superuser = superuser_arg(roleid);

	entry->kind = BINDING_NONE;
	rel = try_table_open(relid, AccessShareLock);
	if (rel == NULL)
		refuse_undetermined(tenant);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	while ((tuple = systable_getnext(scan)) != NULL)
	{
		Datum		values[2];
		bool		nulls[2];
		text	   *bound;
		int			len;

		heap_deform_tuple(tuple, RelationGetDescr(rel), values, nulls);
		if (nulls[0] || nulls[1])
			continue;
		if (DatumGetObjectId(values[0]) != roleid &&
			(is_superuser ||
			 !has_privs_of_role(roleid, DatumGetObjectId(values[0]))))
			continue;
		bound = DatumGetTextPP(values[1]);
		len = Min(VARSIZE_ANY_EXHDR(bound), IDEM_MAX_KEY_BYTES);
		if (entry->kind == BINDING_NONE)
		{
			entry->kind = BINDING_ONE;
			entry->len = len;
			memcpy(entry->tenant, VARDATA_ANY(bound), len);
			entry->tenant[len] = '\0';
		}
		else if (entry->kind == BINDING_ONE &&
				 (len != entry->len ||
				  memcmp(entry->tenant, VARDATA_ANY(bound), len) != 0))
		{
			entry->kind = BINDING_CONFLICT;
			memcpy(entry->other, VARDATA_ANY(bound), len);
			entry->other[len] = '\0';
		}
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/*
 * What the bindings say about roleid, into *out, from the cache when it is
 * valid.  An invalidation that arrives while the table is read (opening it
 * processes pending ones) marks the cache invalid again, and the answer,
 * correct for this call, is then not kept; nor is any answer while the
 * table's trigger does not fire for every change.
 */
static void
role_binding(Oid roleid, const char *tenant, RoleBinding *out)
{
	RoleBinding *entry;
	bool		present;

	if (!callbacks_registered)
	{
		idem_on_relcache_change(binding_relcache_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHMEMMEMROLE, binding_roles_changed,
									  (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHOID, binding_roles_changed,
									  (Datum) 0);
		CacheRegisterSyscacheCallback(SUBSCRIPTIONRELMAP,
									  binding_subscriptions_changed,
									  (Datum) 0);
		callbacks_registered = true;
	}
	/*
	 * The look-ups process invalidations, which may concern what was just
	 * looked up: as RangeVarGetRelidExtended does, look up again until no
	 * invalidation message arrived meanwhile.  The count of messages, not
	 * binding_relid (which binding_relcache_changed resets), decides: a
	 * reset of the caches that no message caused (debug_discard_caches)
	 * changes nothing that was read, and would otherwise reset it at every
	 * pass, without end.
	 */
	while (!OidIsValid(binding_relid))
	{
		uint64		invalidations = SharedInvalidMessageCounter;
		Oid			relid;
		bool		trusted;

		CHECK_FOR_INTERRUPTS();
		relid = find_binding_relation();
		if (!OidIsValid(relid))
			refuse_undetermined(tenant);

		/*
		 * A cache only while every change of the table invalidates it: its
		 * trigger fires always, and no subscription writes it (the apply
		 * worker fires no statement trigger)
		 */
		trusted = binding_trigger_fires_always(relid) &&
			!OidIsValid(subscription_of(relid));
		if (invalidations != SharedInvalidMessageCounter)
			continue;
		cache_valid = false;
		binding_relid = relid;
		cache_trusted = trusted;
	}
	if (!cache_valid || binding_cache == NULL)
	{
		HASHCTL		ctl;

		if (binding_cache != NULL)
			hash_destroy(binding_cache);
		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(RoleBinding);
		ctl.hcxt = CacheMemoryContext;
		binding_cache = hash_create("idem tenant bindings", 16, &ctl,
									HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		cache_valid = true;
	}

	entry = hash_search(binding_cache, &roleid, HASH_FIND, NULL);
	if (entry != NULL)
	{
		*out = *entry;
		return;
	}

	out->roleid = roleid;
	read_binding(binding_relid, roleid, out, tenant);
	if (!cache_valid || !cache_trusted)
		return;
	entry = hash_search(binding_cache, &roleid, HASH_ENTER, &present);
	*entry = *out;
}

static char *
role_name(Oid roleid)
{
	char	   *name = GetUserNameFromId(roleid, true);

	return name ? name : psprintf("%u", roleid);
}

/*
 * The restriction on the current call: the bindings of the session user,
 * the SET ROLE role and the current user.  Errors (42501) when no tenant
 * is allowed: conflicting bindings, or none under idem.require_binding.
 * tenant, if not NULL, names what the caller asked for, for the message.
 */
static Restriction
current_restriction(const char *tenant)
{
	Oid			roles[3];
	Restriction r;

	settings_require_readable();
	r.restricted = false;
	r.by_role = InvalidOid;
	roles[0] = GetSessionUserId();
	roles[1] = GetOuterUserId();
	roles[2] = GetUserId();
	for (int i = 0; i < 3; i++)
	{
		RoleBinding b;

		if (!OidIsValid(roles[i]) ||
			(i > 0 && roles[i] == roles[i - 1]) ||
			(i == 2 && roles[2] == roles[0]))
			continue;
		role_binding(roles[i], tenant, &b);
		if (b.kind == BINDING_NONE)
			continue;
		if (b.kind == BINDING_CONFLICT)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 tenant ?
					 errmsg("permission denied for idem tenant \"%s\"", tenant) :
					 errmsg("permission denied for idem tenants"),
					 errdetail("Role \"%s\" is bound to idem tenants \"%s\" and \"%s\", through the roles whose privileges it has.",
							   role_name(roles[i]), b.tenant, b.other)));
		if (r.restricted &&
			(b.len != r.by.len || memcmp(b.tenant, r.by.tenant, b.len) != 0))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 tenant ?
					 errmsg("permission denied for idem tenant \"%s\"", tenant) :
					 errmsg("permission denied for idem tenants"),
					 errdetail("This call acts as role \"%s\", bound to idem tenant \"%s\", and as role \"%s\", bound to idem tenant \"%s\".",
							   role_name(r.by_role), r.by.tenant,
							   role_name(roles[i]), b.tenant)));
		r.restricted = true;
		r.by = b;
		r.by_role = roles[i];
	}

	if (!r.restricted && idem_require_binding && !superuser_arg(roles[2]))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 tenant ?
				 errmsg("permission denied for idem tenant \"%s\"", tenant) :
				 errmsg("permission denied for idem tenants"),
				 errdetail("Role \"%s\" is bound to no idem tenant, and idem.require_binding is on.",
						   role_name(roles[2]))));
	return r;
}

/*
 * Refuse, before anything is read or written, a tenant that the roles this
 * call acts as may not touch.
 */
void
tenant_check(const text *tenant)
{
	int			len = VARSIZE_ANY_EXHDR(tenant);
	char	   *name = text_to_cstring(tenant);
	Restriction r = current_restriction(name);

	if (!r.restricted ||
		(len == r.by.len && memcmp(VARDATA_ANY(tenant), r.by.tenant, len) == 0))
	{
		pfree(name);
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for idem tenant \"%s\"", name),
			 errdetail("Role \"%s\" is bound to idem tenant \"%s\".",
					   role_name(r.by_role), r.by.tenant)));
}

/*
 * The tenant that the roles this call acts as are bound to, NULL when they
 * may touch every tenant; an error (42501) when they may touch none
 */
text *
tenant_bound(void)
{
	Restriction r = current_restriction(NULL);

	if (!r.restricted)
		return NULL;
	return cstring_to_text_with_len(r.by.tenant, r.by.len);
}

/*
 * idem_tenant(): the tenant this call is bound to, NULL when it may touch
 * every tenant; an error when it may touch none.  idem_record's row-level
 * security policy is built on it.
 */
Datum
idem_tenant(PG_FUNCTION_ARGS)
{
	text	   *tenant = tenant_bound();

	if (tenant == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(tenant);
}

static void
require_superuser(void)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be superuser to change idem tenant bindings")));
}

/* The role argument, not NULL */
static Oid
role_oid_from_arg(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("role must not be null")));
	return PG_GETARG_OID(0);
}

pg_noreturn static void
refuse_unknown_role(Oid roleid)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("role with OID %u does not exist", roleid)));
}

/* The role argument: an existing role */
static Oid
role_from_arg(FunctionCallInfo fcinfo)
{
	Oid			roleid = role_oid_from_arg(fcinfo);

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(roleid)))
		refuse_unknown_role(roleid);
	return roleid;
}

/* The binding table, for the statements of idem_bind */
static Oid
binding_table(void)
{
	Oid			relid = find_binding_relation();

	if (!OidIsValid(relid))
		refuse_undetermined(NULL);
	return relid;
}

/*
 * Run one statement on idem_binding; returns the rows it changed.  The
 * statement names the table without its schema: it runs with the pinned
 * search_path (settings_pin_search_path), whose schemas are pg_catalog and
 * the table's, with pg_temp last, so nothing else can stand in for it.
 */
static uint64
binding_write(const char *sql, int nargs, Oid *argtypes, Datum *values)
{
	Oid			relid = binding_table();
	int			nestlevel;
	int			rc;
	uint64		rows;

	nestlevel = settings_pin_search_path(get_rel_namespace(relid));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_with_args(sql, nargs, argtypes, values, NULL, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_with_args failed: %s",
			 SPI_result_code_string(rc));
	rows = SPI_processed;
	AtEOXact_GUC(true, nestlevel);
	SPI_finish();
	return rows;
}

/*
 * idem_bind(role, tenant): bind a role to a tenant, replacing its binding
 * if it had one.  Superuser only.
 */
Datum
idem_bind(PG_FUNCTION_ARGS)
{
	Oid			argtypes[2] = {REGROLEOID, TEXTOID};
	Datum		values[2];
	text	   *tenant;
	int			len;

	require_superuser();
	values[0] = ObjectIdGetDatum(role_from_arg(fcinfo));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tenant must not be null")));
	tenant = PG_GETARG_TEXT_PP(1);
	len = VARSIZE_ANY_EXHDR(tenant);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tenant must not be empty")));
	if (len > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("tenant is too long"),
				 errdetail("The tenant is %d bytes long; the limit is %d bytes.",
						   len, IDEM_MAX_KEY_BYTES)));
	values[1] = PointerGetDatum(tenant);
	binding_write("INSERT INTO idem_binding AS b (role, tenant) VALUES ($1, $2)"
				  " ON CONFLICT (role) DO UPDATE SET tenant = excluded.tenant",
				  2, argtypes, values);
	PG_RETURN_VOID();
}

/*
 * idem_unbind(role): drop a role's binding; returns whether it had one.
 * Superuser only.  A dropped role's binding stays behind (DROP ROLE runs
 * no trigger in any database), and its name is gone with it: it is removed
 * by the role's OID, idem_unbind(16384).  An OID that is neither a role nor
 * bound is an error, as for idem_bind, so that a mistyped OID is not
 * mistaken for a binding removed.
 */
Datum
idem_unbind(PG_FUNCTION_ARGS)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1];
	Oid			roleid;
	uint64		rows;

	require_superuser();
	roleid = role_oid_from_arg(fcinfo);
	values[0] = ObjectIdGetDatum(roleid);
	rows = binding_write("DELETE FROM idem_binding WHERE role OPERATOR(pg_catalog.=) $1",
						 1, argtypes, values);
	if (rows == 0 && !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(roleid)))
		refuse_unknown_role(roleid);
	PG_RETURN_BOOL(rows > 0);
}

/*
 * The statement trigger on idem_binding: any change to the bindings (by
 * idem_bind, by hand, by a restore) invalidates every backend's cache at
 * commit, and this backend's at the next command.
 */
Datum
idem_binding_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_binding_changed() was not called by a trigger")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}

/*
 * idem_role_in(cstring): the input of idem_binding's role column, a role
 * name.  pg_dump writes the column by role name, and pg_restore reads it
 * back in a cluster that may lack some of the roles; regrole's input would
 * fail there, and with it the COPY of every binding.  A name that names no
 * role gives a WARNING naming it and InvalidOid, which the row trigger
 * idem_binding_unknown_role drops: the other bindings restore.  An OID from
 * the source cluster is never taken for a role: a number is a name here.
 */
Datum
idem_role_in(PG_FUNCTION_ARGS)
{
	char	   *input = pstrdup(PG_GETARG_CSTRING(0));
	List	   *names;
	Oid			roleid;

	if (!SplitIdentifierString(input, '.', &names) || list_length(names) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid role name \"%s\"", PG_GETARG_CSTRING(0))));
	roleid = get_role_oid((char *) linitial(names), true);
	if (!OidIsValid(roleid))
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role \"%s\" does not exist", (char *) linitial(names)),
				 errdetail("Its idem tenant binding is skipped."),
				 errhint("Create the role, then bind it again with idem_bind().")));
	PG_RETURN_OID(roleid);
}

/*
 * idem_role_out(idem_role): the role's current name, so that a binding
 * follows its role through ALTER ROLE ... RENAME into a dump; the OID of a
 * dropped role (pg_dump leaves such bindings out).
 */
Datum
idem_role_out(PG_FUNCTION_ARGS)
{
	Oid			roleid = PG_GETARG_OID(0);
	char	   *name = GetUserNameFromId(roleid, true);

	if (name == NULL)
		PG_RETURN_CSTRING(psprintf("%u", roleid));
	PG_RETURN_CSTRING(pstrdup(quote_identifier(name)));
}

/*
 * The row trigger on idem_binding: a row whose role name named no role
 * (idem_role_in has warned about it) is not stored, so that one missing
 * role fails neither the COPY of a restore nor the primary key of the
 * next one.
 */
Datum
idem_binding_unknown_role(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	HeapTuple	tuple;
	bool		isnull;
	Datum		role;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_binding_unknown_role() was not called by a BEFORE ROW trigger")));
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;
	role = heap_getattr(tuple, 1, RelationGetDescr(trigdata->tg_relation),
						&isnull);
	if (!isnull && !OidIsValid(DatumGetObjectId(role)))
		return PointerGetDatum(NULL);
	return PointerGetDatum(tuple);
}
