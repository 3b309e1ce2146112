/*-------------------------------------------------------------------------
 *
 * api.h
 *	  The argument checks of the SQL-callable functions that outbox.c's
 *	  functions share with api.c's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_API_H
#define IDEM_API_H

#include "idem.h"

#include "fmgr.h"

/*
 * A SQL-callable function whose body is another's, called with the
 * arguments that tell its overloads apart (a fingerprint or payload given
 * as bytea, text or jsonb, a failure or a success): body(fcinfo, ...).
 * The overloads keep a C symbol each, which their SQL definitions name.
 */
#define IDEM_SQL_FUNCTION(name, body, ...) \
PG_FUNCTION_INFO_V1(name); \
Datum \
name(PG_FUNCTION_ARGS) \
{ \
	return body(fcinfo, __VA_ARGS__); \
} \
extern int no_such_variable

extern void require_not_null(FunctionCallInfo fcinfo, int argno,
							 const char *name);
extern text *check_key_part(text *part, const char *name);
extern text *key_part_from_arg(FunctionCallInfo fcinfo, int argno,
							   const char *name);
extern int32 check_status(int32 status);
extern Jsonb *check_headers(Jsonb *headers);
extern int32 check_attempt(int32 attempt);
extern bool bool_from_arg(FunctionCallInfo fcinfo, int argno,
						  const char *name);
extern void check_body_size(const char *what, bytea *body);

#endif							/* IDEM_API_H */
