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

/* The row type of idem_claim and idem_replay, built once per backend */
static TupleDesc answer_desc = NULL;

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
	bytea	   *body;
	Size		limit = (Size) idem_max_body_size * 1024;

	if (PG_ARGISNULL(argno))
		return NULL;
	body = jsonb ? jsonb_body(PG_GETARG_DATUM(argno)) : PG_GETARG_BYTEA_PP(argno);
	if (VARSIZE_ANY_EXHDR(body) > limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("response body of %zu bytes is larger than idem.max_body_size",
						(Size) VARSIZE_ANY_EXHDR(body)),
				 errdetail("idem.max_body_size is %zu bytes.", limit)));
	return body;
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
get_answer_desc(FunctionCallInfo fcinfo)
{
	if (answer_desc == NULL)
	{
		TupleDesc	desc;
		MemoryContext old;

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		old = MemoryContextSwitchTo(TopMemoryContext);
		answer_desc = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
	}
	return answer_desc;
}

static HeapTuple
answer_tuple(FunctionCallInfo fcinfo, const IdemAnswer *answer)
{
	Datum		values[6];
	bool		nulls[6];

	values[0] = CStringGetTextDatum(outcome_name(answer->outcome));
	nulls[0] = false;
	values[1] = Int32GetDatum(answer->status);
	nulls[1] = !answer->has_status;
	values[2] = PointerGetDatum(answer->body);
	nulls[2] = answer->body == NULL;
	values[3] = Int32GetDatum(answer->attempt);
	values[4] = TimestampTzGetDatum(answer->created_at);
	values[5] = TimestampTzGetDatum(answer->expires_at);
	nulls[3] = nulls[4] = nulls[5] = !answer->has_record;

	return heap_form_tuple(get_answer_desc(fcinfo), values, nulls);
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

	key_from_args(fcinfo, &key);
	fingerprint_from_arg(fcinfo, 3, kind, &fp);
	wait = bool_from_arg(fcinfo, 4, "wait");
	lease = PG_ARGISNULL(5) ? NULL : PG_GETARG_INTERVAL_P(5);
	retention = arg_given(fcinfo, 6) ? PG_GETARG_INTERVAL_P(6) : NULL;

	protocol_claim(&key, &fp, wait, lease, retention, &answer);
	return HeapTupleGetDatum(answer_tuple(fcinfo, &answer));
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
 * idem_complete (status, body, attempt) and idem_fail (status, body,
 * retryable, attempt): the same arguments but for retryable.
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
	IdemFinish	how;

	key_from_args(fcinfo, &key);
	status = status_from_arg(fcinfo, 3);
	body = body_from_arg(fcinfo, 4, jsonb);
	if (failed)
		retryable = bool_from_arg(fcinfo, 5, "retryable");
	has_attempt = attempt_from_arg(fcinfo, failed ? 6 : 5, &attempt);

	how = !failed ? IDEM_FINISH_COMPLETE :
		retryable ? IDEM_FINISH_FAIL_RETRYABLE : IDEM_FINISH_FAIL;
	protocol_finish(&key, how, has_attempt, attempt, true, status, body);
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
								   attempt, false, 0, NULL));
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
			funcctx->user_fctx = answer_tuple(fcinfo, &answer);
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
