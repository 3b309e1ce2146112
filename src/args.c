/*-------------------------------------------------------------------------
 *
 * args.c
 *	  The checks of the SQL-callable functions' arguments that the record
 *	  functions (api.c) and the outbox (outbox.c) share: a key's parts, a
 *	  status, a body and its size, headers, a fencing token, a boolean, the
 *	  arrays of a batch function and the CONTEXT line naming an element.
 *
 * None of idem's functions is STRICT: a NULL argument is a caller's bug and
 * gets an error naming it, never a NULL result.  Each bad-input SQLSTATE is
 * chosen in one helper here, so that both rooms refuse alike.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "args.h"
#include "fingerprint.h"
#include "settings.h"

void
require_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* A tenant, endpoint or key: empty and over-long are refused */
text *
check_key_part(text *part, const char *name)
{
	int			len = VARSIZE_ANY_EXHDR(part);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	if (len > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s \"%.*s...\" is too long", name,
						pg_mbcliplen(VARDATA_ANY(part), len, 32),
						VARDATA_ANY(part)),
				 errdetail("The %s is %d bytes long; the limit is %d bytes.",
						   name, len, IDEM_MAX_KEY_BYTES)));
	return part;
}

/* ... and NULL too, as an argument */
text *
key_part_from_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	require_not_null(fcinfo, argno, name);
	return check_key_part(PG_GETARG_TEXT_PP(argno), name);
}

int32
check_status(int32 status)
{
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status code", status),
				 errdetail("A status must be between 100 and 599.")));
	return status;
}

int32
status_from_arg(FunctionCallInfo fcinfo, int argno)
{
	require_not_null(fcinfo, argno, "status");
	return check_status(PG_GETARG_INT32(argno));
}

/* A response body, NULL for none; jsonb bodies are stored as their text */
bytea *
body_from_arg(FunctionCallInfo fcinfo, int argno, bool jsonb)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return jsonb ? jsonb_body(PG_GETARG_DATUM(argno)) : PG_GETARG_BYTEA_PP(argno);
}

/*
 * idem.max_body_size bounds an outbox message's payload and the answer
 * stored for it, as it bounds a response body
 */
void
check_body_size(const char *what, bytea *body)
{
	Size		limit = (Size) idem_max_body_size * 1024;
	Size		size = VARSIZE_ANY_EXHDR(body);

	settings_require_readable();
	if (size > limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s of %zu bytes is larger than idem.max_body_size",
						what, size),
				 errdetail("idem.max_body_size is %zu bytes.", limit)));
}

/*
 * idem.max_body_size bounds what a replay sends back: the body's bytes plus
 * the stored size of the headers.
 */
void
check_response_size(bytea *body, Jsonb *headers)
{
	Size		limit = (Size) idem_max_body_size * 1024;
	Size		body_size = body != NULL ? VARSIZE_ANY_EXHDR(body) : 0;
	Size		headers_size = headers != NULL ? VARSIZE_ANY_EXHDR(headers) : 0;

	settings_require_readable();
	if (body_size > limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("response body of %zu bytes is larger than idem.max_body_size",
						body_size),
				 errdetail("idem.max_body_size is %zu bytes.", limit)));
	if (body_size + headers_size > limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("response of %zu bytes (body) and %zu bytes (headers) is larger than idem.max_body_size",
						body_size, headers_size),
				 errdetail("idem.max_body_size is %zu bytes, and bounds the body and the headers together.",
						   limit)));
}

/* RFC 9110's token characters, the only ones a header name may have */
static bool
is_header_name(const char *s, int len)
{
	if (len == 0)
		return false;
	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
			  (c >= 'a' && c <= 'z') ||
			  (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL)))
			return false;
	}
	return true;
}

/* A header value must not break its line: no CR, LF or NUL */
static bool
is_header_value(const char *s, int len)
{
	for (int i = 0; i < len; i++)
		if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
			return false;
	return true;
}

pg_noreturn static void report_bad_headers(const char *detail);

/* detail is a full sentence, already formatted */
static void
report_bad_headers(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("headers must be a JSON object of header names to strings or arrays of strings"),
			 errdetail_internal("%s", detail)));
}

/*
 * Response headers, NULL for none: a JSON object whose keys are header
 * names and whose values are strings, or arrays of strings for a header
 * sent more than once (Set-Cookie).  Anything else could not be replayed as
 * HTTP headers, so it is refused here rather than when a replay sends it.
 */
Jsonb *
check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	const char *name = "";
	int			name_len = 0;

	if (JB_ROOT_IS_SCALAR(headers) || !JB_ROOT_IS_OBJECT(headers))
		report_bad_headers("The value given is not a JSON object.");

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
				if (++depth > 1)
					report_bad_headers(psprintf("The value of header \"%.*s\" is an object.",
													 name_len, name));
				break;
			case WJB_BEGIN_ARRAY:
				if (++depth > 2)
					report_bad_headers(psprintf("The value of header \"%.*s\" has a nested array.",
													 name_len, name));
				break;
			case WJB_END_OBJECT:
			case WJB_END_ARRAY:
				depth--;
				break;
			case WJB_KEY:
				name = v.val.string.val;
				name_len = v.val.string.len;
				if (!is_header_name(name, name_len))
					report_bad_headers(psprintf("\"%.*s\" is not a valid header name.",
													 name_len, name));
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				if (v.type != jbvString)
					report_bad_headers(psprintf("The value of header \"%.*s\" is not a string.",
													 name_len, name));
				if (!is_header_value(v.val.string.val, v.val.string.len))
					report_bad_headers(psprintf("The value of header \"%.*s\" has a line break or a NUL.",
													 name_len, name));
				break;
			case WJB_DONE:
				break;
		}
	}
	return headers;
}

Jsonb *
headers_from_arg(FunctionCallInfo fcinfo, int argno)
{
	if (!arg_given(fcinfo, argno))
		return NULL;
	return check_headers(PG_GETARG_JSONB_P(argno));
}

int32
check_attempt(int32 attempt)
{
	if (attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt %d is not a valid attempt number", attempt),
				 errdetail("Attempts are numbered from 1.")));
	return attempt;
}

/* An optional fencing token: false when the caller gave none */
bool
attempt_from_arg(FunctionCallInfo fcinfo, int argno, int32 *attempt)
{
	if (PG_ARGISNULL(argno))
		return false;
	*attempt = check_attempt(PG_GETARG_INT32(argno));
	return true;
}

/* An integer argument, not NULL, at least 1 */
int32
positive_from_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	int32		value;

	require_not_null(fcinfo, argno, name);
	value = PG_GETARG_INT32(argno);
	if (value < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least 1", name),
				 errdetail("The value given was %d.", value)));
	return value;
}

bool
bool_from_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	require_not_null(fcinfo, argno, name);
	return PG_GETARG_BOOL(argno);
}

/*
 * An array argument: NULL for a NULL optional one.  Only one-dimensional
 * arrays (or empty ones) are taken; *nitems is the number of elements.
 */
ArrayType *
array_from_arg(FunctionCallInfo fcinfo, int argno, const char *name,
			   bool optional, bool null_elements, int *nitems)
{
	ArrayType  *array;

	*nitems = 0;
	if (optional && !arg_given(fcinfo, argno))
		return NULL;
	require_not_null(fcinfo, argno, name);
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name),
				 errdetail("The array given has %d dimensions.",
						   ARR_NDIM(array))));
	if (!null_elements && array_contains_nulls(array))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not contain nulls", name)));
	*nitems = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
	return array;
}

/* An element-wise array goes with keys: as many elements, or none given */
void
require_length(const ArrayType *array, const char *name, int nitems,
			   int nkeys)
{
	if (array != NULL && nitems != nkeys)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must have as many elements as keys", name),
				 errdetail("keys has %d elements, %s has %d.",
						   nkeys, name, nitems)));
}

/* A walk over an array's elements in step with keys; NULL for no array */
ArrayIterator
walk(ArrayType *array)
{
	return array != NULL ? array_create_iterator(array, 0, NULL) : NULL;
}

/*
 * The walk's next element: false when it is NULL, or there is no array.
 * The caller counts the elements: every array walked is as long as keys.
 */
bool
next_element(ArrayIterator it, Datum *value)
{
	bool		isnull = true;

	if (it != NULL && !array_iterate(it, value, &isnull))
		elog(ERROR, "array ended before keys");
	return !isnull;
}

static void
batch_error_context(void *arg)
{
	ArgsBatch  *b = (ArgsBatch *) arg;

	if (b->element > 0)
		errcontext("element %d of %s", b->element, b->function);
}

/* Start a batch function's run: errors name the element (set by the caller) */
void
args_batch_start(ArgsBatch *b, const char *function)
{
	b->function = function;
	b->element = 0;
	b->callback.callback = batch_error_context;
	b->callback.arg = b;
	b->callback.previous = error_context_stack;
	error_context_stack = &b->callback;
	b->memory = AllocSetContextCreate(CurrentMemoryContext,
									  "idem batch element",
									  ALLOCSET_DEFAULT_SIZES);
}

void
args_batch_end(ArgsBatch *b)
{
	error_context_stack = b->callback.previous;
	MemoryContextDelete(b->memory);
}
