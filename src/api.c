/*-------------------------------------------------------------------------
 *
 * api.c
 *	  The SQL-callable functions: unpack and check arguments, call the
 *	  protocol, build the result.
 *
 * None of these functions is STRICT: a NULL argument is a caller's bug and
 * gets an error naming it, never a NULL result.  Each bad-input SQLSTATE is
 * chosen in one helper here.  The bytea and text overloads of a body share
 * a C function (both are varlenas whose payload is the bytes); a text
 * fingerprint has its own, since it is digested over UTF-8 whatever the
 * database encoding; the jsonb ones canonicalize first.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "idem.h"

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_claim_text);
PG_FUNCTION_INFO_V1(idem_claim_jsonb);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_complete_jsonb);
PG_FUNCTION_INFO_V1(idem_fail);
PG_FUNCTION_INFO_V1(idem_fail_jsonb);
PG_FUNCTION_INFO_V1(idem_replay);
PG_FUNCTION_INFO_V1(idem_replay_text);
PG_FUNCTION_INFO_V1(idem_replay_jsonb);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_purge);
PG_FUNCTION_INFO_V1(idem_list);
PG_FUNCTION_INFO_V1(idem_forget);

/* How a function's fingerprint argument is given */
typedef enum FingerprintKind
{
	FP_BYTEA,
	FP_TEXT,
	FP_JSONB
} FingerprintKind;

/*
 * The row types of idem_claim and idem_replay, built once per backend: the
 * current one, and 0.1.0's (no headers column), which the previous
 * version's SQL definitions still declare between installing this library
 * and ALTER EXTENSION idem UPDATE.  Those definitions also take fewer
 * arguments, which is how a call says which row it expects.
 */
typedef enum AnswerShape
{
	ANSWER_CURRENT,
	ANSWER_0_1,
	NUM_ANSWER_SHAPES
} AnswerShape;

static TupleDesc answer_desc[NUM_ANSWER_SHAPES];

/*
 * Whether an optional argument was given and is not NULL.  Between
 * installing a new library and ALTER EXTENSION idem UPDATE, the previous
 * version's SQL definitions call these functions with fewer arguments:
 * an argument they lack is never read.
 */
static inline bool
arg_given(FunctionCallInfo fcinfo, int argno)
{
	return PG_NARGS() > argno && !PG_ARGISNULL(argno);
}

static void
require_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* A tenant, endpoint or key: NULL, empty and over-long are refused */
static text *
key_part_from_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text	   *part;
	int			len;

	require_not_null(fcinfo, argno, name);
	part = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(part);
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

/*
 * The tenant, endpoint and key: arguments 0 to 2 of every function.  The
 * tenant binding is checked here, before anything reads or writes.
 */
static void
key_from_args(FunctionCallInfo fcinfo, IdemKey *key)
{
	key->tenant = key_part_from_arg(fcinfo, 0, "tenant");
	key->endpoint = key_part_from_arg(fcinfo, 1, "endpoint");
	key->key = key_part_from_arg(fcinfo, 2, "key");
	tenant_check(key->tenant);
}

static int32
status_from_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		status;

	require_not_null(fcinfo, argno, "status");
	status = PG_GETARG_INT32(argno);
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status code", status),
				 errdetail("A status must be between 100 and 599.")));
	return status;
}

/* A response body, NULL for none; jsonb bodies are stored as their text */
static bytea *
body_from_arg(FunctionCallInfo fcinfo, int argno, bool jsonb)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return jsonb ? jsonb_body(PG_GETARG_DATUM(argno)) : PG_GETARG_BYTEA_PP(argno);
}

/*
 * idem.max_body_size bounds what a replay sends back: the body's bytes plus
 * the stored size of the headers.
 */
static void
check_response_size(bytea *body, Jsonb *headers)
{
	Size		limit = (Size) idem_max_body_size * 1024;
	Size		body_size = body != NULL ? VARSIZE_ANY_EXHDR(body) : 0;
	Size		headers_size = headers != NULL ? VARSIZE_ANY_EXHDR(headers) : 0;

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
static Jsonb *
headers_from_arg(FunctionCallInfo fcinfo, int argno)
{
	Jsonb	   *headers;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	const char *name = "";
	int			name_len = 0;

	if (!arg_given(fcinfo, argno))
		return NULL;
	headers = PG_GETARG_JSONB_P(argno);
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

/* An optional fencing token: false when the caller gave none */
static bool
attempt_from_arg(FunctionCallInfo fcinfo, int argno, int32 *attempt)
{
	if (PG_ARGISNULL(argno))
		return false;
	*attempt = PG_GETARG_INT32(argno);
	if (*attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt %d is not a valid attempt number", *attempt),
				 errdetail("Attempts are numbered from 1.")));
	return true;
}

static bool
bool_from_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	require_not_null(fcinfo, argno, name);
	return PG_GETARG_BOOL(argno);
}

static TupleDesc
get_answer_desc(FunctionCallInfo fcinfo, AnswerShape shape)
{
	if (answer_desc[shape] == NULL)
	{
		TupleDesc	desc;
		MemoryContext old;

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		if (desc->natts != (shape == ANSWER_CURRENT ? 7 : 6))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the SQL definition of %s does not match the idem library",
							get_func_name(fcinfo->flinfo->fn_oid)),
					 errhint("Run ALTER EXTENSION idem UPDATE.")));
		old = MemoryContextSwitchTo(TopMemoryContext);
		answer_desc[shape] = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
	}
	return answer_desc[shape];
}

/* The answer as a row of the caller's row type */
static HeapTuple
answer_tuple(FunctionCallInfo fcinfo, AnswerShape shape,
			 const IdemAnswer *answer)
{
	Datum		values[7];
	bool		nulls[7];
	int			c = 0;

	values[c] = CStringGetTextDatum(outcome_name(answer->outcome));
	nulls[c++] = false;
	values[c] = Int32GetDatum(answer->status);
	nulls[c++] = !answer->has_status;
	values[c] = PointerGetDatum(answer->body);
	nulls[c++] = answer->body == NULL;
	if (shape == ANSWER_CURRENT)
	{
		values[c] = PointerGetDatum(answer->headers);
		nulls[c++] = answer->headers == NULL;
	}
	values[c] = Int32GetDatum(answer->attempt);
	nulls[c++] = !answer->has_record;
	values[c] = TimestampTzGetDatum(answer->created_at);
	nulls[c++] = !answer->has_record;
	values[c] = TimestampTzGetDatum(answer->expires_at);
	nulls[c++] = !answer->has_record;

	return heap_form_tuple(get_answer_desc(fcinfo, shape), values, nulls);
}

/* An optional request fingerprint, digested; not present when NULL */
static void
fingerprint_from_arg(FunctionCallInfo fcinfo, int argno, FingerprintKind kind,
					 IdemFingerprint *fp)
{
	fp->present = false;
	if (!arg_given(fcinfo, argno))
		return;
	if (kind == FP_JSONB)
		fingerprint_jsonb(PG_GETARG_DATUM(argno), fp);
	else if (kind == FP_TEXT)
		fingerprint_text(PG_GETARG_TEXT_PP(argno), fp);
	else
	{
		bytea	   *raw = PG_GETARG_BYTEA_PP(argno);

		fingerprint_bytes(VARDATA_ANY(raw), VARSIZE_ANY_EXHDR(raw), fp);
	}
}

static Datum
claim(FunctionCallInfo fcinfo, FingerprintKind kind)
{
	IdemKey		key;
	IdemFingerprint fp;
	IdemAnswer	answer;
	bool		wait;
	Interval   *lease;
	Interval   *retention;
	Interval   *wait_timeout;

	key_from_args(fcinfo, &key);
	fingerprint_from_arg(fcinfo, 3, kind, &fp);
	wait = bool_from_arg(fcinfo, 4, "wait");
	lease = PG_ARGISNULL(5) ? NULL : PG_GETARG_INTERVAL_P(5);
	retention = arg_given(fcinfo, 6) ? PG_GETARG_INTERVAL_P(6) : NULL;
	wait_timeout = arg_given(fcinfo, 7) ? PG_GETARG_INTERVAL_P(7) : NULL;
	if (wait_timeout != NULL && !wait)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_timeout needs wait => true"),
				 errdetail("A claim that does not wait answers in_progress at once.")));

	protocol_claim(&key, &fp, wait, lease, retention, wait_timeout, &answer);
	return HeapTupleGetDatum(answer_tuple(fcinfo,
										  PG_NARGS() > 6 ? ANSWER_CURRENT : ANSWER_0_1,
										  &answer));
}

Datum
idem_claim(PG_FUNCTION_ARGS)
{
	return claim(fcinfo, FP_BYTEA);
}

Datum
idem_claim_text(PG_FUNCTION_ARGS)
{
	return claim(fcinfo, FP_TEXT);
}

Datum
idem_claim_jsonb(PG_FUNCTION_ARGS)
{
	return claim(fcinfo, FP_JSONB);
}

/*
 * idem_complete (status, body, attempt, headers) and idem_fail (status,
 * body, retryable, attempt, headers): the same arguments but for retryable.
 */
static Datum
finish(FunctionCallInfo fcinfo, bool jsonb, bool failed)
{
	IdemKey		key;
	int32		status;
	bytea	   *body;
	bool		retryable = false;
	int32		attempt = 0;
	bool		has_attempt;
	Jsonb	   *headers;
	IdemFinish	how;

	key_from_args(fcinfo, &key);
	status = status_from_arg(fcinfo, 3);
	body = body_from_arg(fcinfo, 4, jsonb);
	if (failed)
		retryable = bool_from_arg(fcinfo, 5, "retryable");
	has_attempt = attempt_from_arg(fcinfo, failed ? 6 : 5, &attempt);
	headers = headers_from_arg(fcinfo, failed ? 7 : 6);
	check_response_size(body, headers);

	how = !failed ? IDEM_FINISH_COMPLETE :
		retryable ? IDEM_FINISH_FAIL_RETRYABLE : IDEM_FINISH_FAIL;
	protocol_finish(&key, how, has_attempt, attempt, true, status, body,
					headers);
	PG_RETURN_VOID();
}

Datum
idem_complete(PG_FUNCTION_ARGS)
{
	return finish(fcinfo, false, false);
}

Datum
idem_complete_jsonb(PG_FUNCTION_ARGS)
{
	return finish(fcinfo, true, false);
}

Datum
idem_fail(PG_FUNCTION_ARGS)
{
	return finish(fcinfo, false, true);
}

Datum
idem_fail_jsonb(PG_FUNCTION_ARGS)
{
	return finish(fcinfo, true, true);
}

Datum
idem_release(PG_FUNCTION_ARGS)
{
	IdemKey		key;
	int32		attempt = 0;
	bool		has_attempt;

	key_from_args(fcinfo, &key);
	has_attempt = attempt_from_arg(fcinfo, 3, &attempt);

	PG_RETURN_BOOL(protocol_finish(&key, IDEM_FINISH_RELEASE, has_attempt,
								   attempt, false, 0, NULL, NULL));
}

/*
 * A set-returning function of at most one row, so that "no record" (a
 * claim would execute) is no row rather than a row of NULLs.
 */
static Datum
replay(FunctionCallInfo fcinfo, FingerprintKind kind)
{
	FuncCallContext *funcctx;

	if (SRF_IS_FIRSTCALL())
	{
		IdemKey		key;
		IdemFingerprint fp;
		IdemAnswer	answer;
		MemoryContext old;

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		key_from_args(fcinfo, &key);
		fingerprint_from_arg(fcinfo, 3, kind, &fp);
		if (protocol_replay(&key, &fp, &answer))
		{
			funcctx->user_fctx =
				answer_tuple(fcinfo,
							 PG_NARGS() > 3 ? ANSWER_CURRENT : ANSWER_0_1,
							 &answer);
			funcctx->max_calls = 1;
		}
		MemoryContextSwitchTo(old);
	}

	funcctx = SRF_PERCALL_SETUP();
	if (funcctx->call_cntr < funcctx->max_calls)
		SRF_RETURN_NEXT(funcctx,
						HeapTupleGetDatum((HeapTuple) funcctx->user_fctx));
	SRF_RETURN_DONE(funcctx);
}

Datum
idem_replay(PG_FUNCTION_ARGS)
{
	return replay(fcinfo, FP_BYTEA);
}

Datum
idem_replay_text(PG_FUNCTION_ARGS)
{
	return replay(fcinfo, FP_TEXT);
}

Datum
idem_replay_jsonb(PG_FUNCTION_ARGS)
{
	return replay(fcinfo, FP_JSONB);
}

Datum
idem_purge(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64((int64) purge_all());
}

/*
 * The operator listing of one tenant's records, bodies only if asked.  A
 * session bound to a tenant can list only that tenant.
 */
Datum
idem_list(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	List	   *rows;

	if (SRF_IS_FIRSTCALL())
	{
		text	   *tenant;
		text	   *endpoint = NULL;
		bool		with_body;
		int32		max_rows;
		TupleDesc	desc;
		MemoryContext old;

		tenant = key_part_from_arg(fcinfo, 0, "tenant");
		tenant_check(tenant);
		if (!PG_ARGISNULL(1))
			endpoint = key_part_from_arg(fcinfo, 1, "endpoint");
		with_body = bool_from_arg(fcinfo, 2, "with_body");
		require_not_null(fcinfo, 3, "max_rows");
		max_rows = PG_GETARG_INT32(3);
		if (max_rows < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_rows %d must not be negative", max_rows)));

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		funcctx->tuple_desc = BlessTupleDesc(desc);
		rows = protocol_list(tenant, endpoint, with_body, max_rows,
							 funcctx->tuple_desc);
		funcctx->user_fctx = rows;
		funcctx->max_calls = list_length(rows);
		MemoryContextSwitchTo(old);
	}

	funcctx = SRF_PERCALL_SETUP();
	rows = (List *) funcctx->user_fctx;
	if (funcctx->call_cntr < funcctx->max_calls)
	{
		/* SRF_RETURN_NEXT counts the call before it evaluates its result */
		Datum		row = HeapTupleGetDatum((HeapTuple) list_nth(rows, funcctx->call_cntr));

		SRF_RETURN_NEXT(funcctx, row);
	}
	SRF_RETURN_DONE(funcctx);
}

Datum
idem_forget(PG_FUNCTION_ARGS)
{
	IdemKey		key;

	key_from_args(fcinfo, &key);
	PG_RETURN_BOOL(protocol_forget(&key));
}
