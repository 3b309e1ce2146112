/*-------------------------------------------------------------------------
 *
 * decisions.c
 *	  One LOG line per decision, so that every request and message of one
 *	  intent can be pulled out of the server log with one grep.
 *
 * idem.log_outcomes (superuser-only) says which decisions are logged: none
 * (off), all (on), or only those that tell of a duplicate or a conflict
 * (conflicts: a claim's in_progress, mismatch and unknown, an enqueue's
 * mismatch).  A line is
 *
 *	 idem claim: tenant="acme" endpoint="POST /v1/orders" key="k-42" outcome=replay attempt=1 trace="t-1"
 *
 * for a claim, and "idem enqueue", "idem take", "idem delivered", "idem
 * retry", "idem dead" with topic= for the outbox's decisions.  trace is
 * idem.trace, which the caller sets per transaction (the packages from a
 * request's traceparent).  The quoted values are escaped (a backslash
 * before a quote or a backslash, \n and \xNN for control characters), so
 * that a key or a trace id can neither end its field nor forge a line.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/builtins.h"

#include "decisions.h"
#include "settings.h"

/* Whether a decision, a conflict or not, gets its log line */
bool
decisions_logged(bool conflict)
{
	settings_require_readable();
	return idem_log_outcomes == IDEM_LOG_ON ||
		(idem_log_outcomes == IDEM_LOG_CONFLICTS && conflict);
}

/* name="value", value escaped */
static void
append_quoted(StringInfo buf, const char *name, const char *value)
{
	appendStringInfo(buf, "%s=\"", name);
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if (*p == '"' || *p == '\\')
			appendStringInfo(buf, "\\%c", *p);
		else if (*p == '\n')
			appendStringInfoString(buf, "\\n");
		else if (*p < 0x20 || *p == 0x7f)
			appendStringInfo(buf, "\\x%02x", *p);
		else
			appendStringInfoChar(buf, (char) *p);
	}
	appendStringInfoChar(buf, '"');
}

/*
 * Log decision (claim, enqueue, ...) of key, whose endpoint is named scope
 * (endpoint, topic); fmt and what follows give the fields between the key
 * and the trace
 */
void
decisions_log(const char *decision, const IdemKey *key, const char *scope,
			  const char *fmt,...)
{
	StringInfoData buf;
	va_list		args;

	initStringInfo(&buf);
	appendStringInfo(&buf, "idem %s: ", decision);
	append_quoted(&buf, "tenant", text_to_cstring(key->tenant));
	appendStringInfoChar(&buf, ' ');
	append_quoted(&buf, scope, text_to_cstring(key->endpoint));
	appendStringInfoChar(&buf, ' ');
	append_quoted(&buf, "key", text_to_cstring(key->key));
	appendStringInfoChar(&buf, ' ');
	for (;;)
	{
		int			needed;

		va_start(args, fmt);
		needed = appendStringInfoVA(&buf, fmt, args);
		va_end(args);
		if (needed == 0)
			break;
		enlargeStringInfo(&buf, needed);
	}
	appendStringInfoChar(&buf, ' ');
	append_quoted(&buf, "trace", idem_trace != NULL ? idem_trace : "");
	ereport(LOG,
			(errmsg_internal("%s", buf.data),
			 errhidestmt(true),
			 errhidecontext(true)));
	pfree(buf.data);
}
