/*-------------------------------------------------------------------------
 *
 * args.h
 *	  The argument checks that api.c and outbox.c share: args.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ARGS_H
#define IDEM_ARGS_H

#include "idem.h"

#include "fmgr.h"
#include "utils/array.h"

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

/* Whether an optional argument is not NULL */
static inline bool
arg_given(FunctionCallInfo fcinfo, int argno)
{
	return !PG_ARGISNULL(argno);
}

extern void require_not_null(FunctionCallInfo fcinfo, int argno,
							 const char *name);
extern text *check_key_part(text *part, const char *name);
extern text *key_part_from_arg(FunctionCallInfo fcinfo, int argno,
							   const char *name);
extern int32 check_status(int32 status);
extern int32 status_from_arg(FunctionCallInfo fcinfo, int argno);
extern bytea *body_from_arg(FunctionCallInfo fcinfo, int argno, bool jsonb);
extern void check_body_size(const char *what, bytea *body);
extern void check_response_size(bytea *body, Jsonb *headers);
extern Jsonb *check_headers(Jsonb *headers);
extern Jsonb *headers_from_arg(FunctionCallInfo fcinfo, int argno);
extern int32 check_attempt(int32 attempt);
extern bool attempt_from_arg(FunctionCallInfo fcinfo, int argno,
							 int32 *attempt);
extern int32 positive_from_arg(FunctionCallInfo fcinfo, int argno,
							   const char *name);
extern bool bool_from_arg(FunctionCallInfo fcinfo, int argno,
						  const char *name);

/*
 * A batch function's run: the element being checked or decided (from 1;
 * 0 outside the elements), named in an error's CONTEXT line, and a memory
 * context for one element, which the caller resets after each
 */
typedef struct ArgsBatch
{
	const char *function;
	int			element;
	ErrorContextCallback callback;
	MemoryContext memory;
} ArgsBatch;

extern void args_batch_start(ArgsBatch *b, const char *function);
extern void args_batch_end(ArgsBatch *b);
extern ArrayType *array_from_arg(FunctionCallInfo fcinfo, int argno,
								 const char *name, bool optional,
								 bool null_elements, int *nitems);
extern void require_length(const ArrayType *array, const char *name,
						   int nitems, int nkeys);
extern ArrayIterator walk(ArrayType *array);
extern bool next_element(ArrayIterator it, Datum *value);

#endif							/* IDEM_ARGS_H */
