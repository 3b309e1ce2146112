/*-------------------------------------------------------------------------
 *
 * tenant.c
 *	  The tenant binding: idem.tenant.
 *
 * Replaying one tenant's response to another is a data leak.  A superuser
 * binds an application role to its tenant with
 *		ALTER ROLE app_acme SET idem.tenant = 'acme';
 * and from then on every idem function called in that role's sessions
 * refuses, before touching any data, a tenant other than 'acme'.  The
 * setting is superuser-only (PGC_SUSET), so the role cannot unbind itself:
 * SET, RESET, set_config() and connection options all need a superuser.
 * The same setting drives the row-level security policy on idem_record, so
 * that even a role granted SELECT on the table sees only its tenant's rows.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "idem.h"

/*
 * Refuse a tenant other than the one this session is bound to.  An empty
 * idem.tenant binds nothing.
 */
void
tenant_check(const text *tenant)
{
	int			len;

	if (idem_tenant == NULL || idem_tenant[0] == '\0')
		return;
	len = VARSIZE_ANY_EXHDR(tenant);
	if (len == (int) strlen(idem_tenant) &&
		memcmp(VARDATA_ANY(tenant), idem_tenant, len) == 0)
		return;

	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for idem tenant \"%s\"",
					text_to_cstring(tenant)),
			 errdetail("This session is bound to idem tenant \"%s\" by idem.tenant.",
					   idem_tenant)));
}
