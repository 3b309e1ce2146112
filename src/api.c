/*-------------------------------------------------------------------------
 *
 * api.c
 *	  The SQL-callable functions: unpack and check arguments, call the
 *	  protocol, build the result.
 *
 * None of these functions is STRICT: a NULL argument is a caller's bug and
 * gets an error naming it, never a NULL result (args.c checks the
 * arguments, for the outbox's functions too).  The bytea and text overloads of a body share
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
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "args.h"
#include "fingerprint.h"
#include "protocol.h"
#include "purge.h"
#include "settings.h"
#include "tenant.h"

PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_purge);
PG_FUNCTION_INFO_V1(idem_list);
PG_FUNCTION_INFO_V1(idem_suspects);
PG_FUNCTION_INFO_V1(idem_forget);

/* How a function's fingerprint argument is given */
typedef enum FingerprintKind
{
	FP_BYTEA,
	FP_TEXT,
	FP_JSONB
} FingerprintKind;

/*
 * The row type of idem_claim and idem_replay, built once per backend.  The
 * SQL objects of every version this library serves (tenant.c,
 * idem_extension_schema) declare these functions alike.
 */
static TupleDesc answer_desc;

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

static TupleDesc
get_answer_desc(FunctionCallInfo fcinfo)
{
	if (answer_desc == NULL)
	{
		TupleDesc	desc;
		MemoryContext old;

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		if (desc->natts != 7)
			elog(ERROR, "incorrect number of output arguments");
		old = MemoryContextSwitchTo(TopMemoryContext);
		answer_desc = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
	}
	return answer_desc;
}

/* The answer's columns, from outcome to expires_at */
static void
answer_values(const IdemAnswer *answer, Datum *values, bool *nulls)
{
	int			c = 0;

	values[c] = CStringGetTextDatum(outcome_name(answer->outcome));
	nulls[c++] = false;
	values[c] = Int32GetDatum(answer->status);
	nulls[c++] = !answer->has_status;
	values[c] = PointerGetDatum(answer->body);
	nulls[c++] = answer->body == NULL;
	values[c] = PointerGetDatum(answer->headers);
	nulls[c++] = answer->headers == NULL;
	values[c] = Int32GetDatum(answer->attempt);
	nulls[c++] = !answer->has_record;
	values[c] = TimestampTzGetDatum(answer->created_at);
	nulls[c++] = !answer->has_record;
	values[c] = TimestampTzGetDatum(answer->expires_at);
	nulls[c++] = !answer->has_record;
}

/* The answer as a row of the caller's row type */
static HeapTuple
answer_tuple(FunctionCallInfo fcinfo, const IdemAnswer *answer)
{
	Datum		values[7];
	bool		nulls[7];

	answer_values(answer, values, nulls);
	return heap_form_tuple(get_answer_desc(fcinfo), values, nulls);
}

/* A request fingerprint, digested */
static void
fingerprint_from_datum(Datum value, FingerprintKind kind, IdemFingerprint *fp)
{
	if (kind == FP_JSONB)
		fingerprint_jsonb(value, fp);
	else if (kind == FP_TEXT)
		fingerprint_text(DatumGetTextPP(value), fp);
	else
	{
		bytea	   *raw = DatumGetByteaPP(value);

		fingerprint_bytes(VARDATA_ANY(raw), VARSIZE_ANY_EXHDR(raw), fp);
	}
}

/* An optional request fingerprint, digested; not present when NULL */
static void
fingerprint_from_arg(FunctionCallInfo fcinfo, int argno, FingerprintKind kind,
					 IdemFingerprint *fp)
{
	fp->present = false;
	if (arg_given(fcinfo, argno))
		fingerprint_from_datum(PG_GETARG_DATUM(argno), kind, fp);
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

	protocol_claim(NULL, &key, &fp, wait, lease, retention, wait_timeout,
				   &answer);
	return HeapTupleGetDatum(answer_tuple(fcinfo, &answer));
}

IDEM_SQL_FUNCTION(idem_claim, claim, FP_BYTEA);
IDEM_SQL_FUNCTION(idem_claim_text, claim, FP_TEXT);
IDEM_SQL_FUNCTION(idem_claim_jsonb, claim, FP_JSONB);

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
	protocol_finish(NULL, &key, how, has_attempt, attempt, true, status, body,
					headers);
	PG_RETURN_VOID();
}

IDEM_SQL_FUNCTION(idem_complete, finish, false, false);
IDEM_SQL_FUNCTION(idem_complete_jsonb, finish, true, false);
IDEM_SQL_FUNCTION(idem_fail, finish, false, true);
IDEM_SQL_FUNCTION(idem_fail_jsonb, finish, true, true);

Datum
idem_release(PG_FUNCTION_ARGS)
{
	IdemKey		key;
	int32		attempt = 0;
	bool		has_attempt;

	key_from_args(fcinfo, &key);
	has_attempt = attempt_from_arg(fcinfo, 3, &attempt);

	PG_RETURN_BOOL(protocol_finish(NULL, &key, IDEM_FINISH_RELEASE,
								   has_attempt,
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

IDEM_SQL_FUNCTION(idem_replay, replay, FP_BYTEA);
IDEM_SQL_FUNCTION(idem_replay_text, replay, FP_TEXT);
IDEM_SQL_FUNCTION(idem_replay_jsonb, replay, FP_JSONB);

Datum
idem_purge(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64((int64) purge_all());
}

/*
 * The operator listing of one tenant's records, bodies only if asked.  A
 * session bound to a tenant can list only that tenant.
 */
/*
 * idem_suspects(since, within): the groups of records that look like one
 * request under several keys (protocol_suspects).  A bound role sees its
 * own tenant's only; the binding is read as the caller.
 */
Datum
idem_suspects(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Interval   *since;
	Interval   *within;
	text	   *tenant;
	List	   *rows;
	ListCell   *lc;

	require_not_null(fcinfo, 0, "since");
	require_not_null(fcinfo, 1, "within");
	since = PG_GETARG_INTERVAL_P(0);
	within = PG_GETARG_INTERVAL_P(1);
	tenant = tenant_bound();
	InitMaterializedSRF(fcinfo, 0);
	rows = protocol_suspects(since, within, tenant, rsinfo->setDesc);
	foreach(lc, rows)
		tuplestore_puttuple(rsinfo->setResult, (HeapTuple) lfirst(lc));
	return (Datum) 0;
}

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

/*
 * Batches: one call for the keys of a whole batch, element-wise arrays in
 * the place of the single calls' scalars.  Every element is decided exactly
 * as the single call would decide it, in the array's order (protocol.c,
 * "Batches"); what the call checks once is what all elements share: the
 * tenant, the endpoint, the tenant binding, the lease and the retention.
 * Every element is checked before the first one is decided, so bad input
 * anywhere in the arrays writes nothing.
 */

/*
 * A batch function's run: where in the batch an error happened and the
 * memory of one element (args.c), and the protocol's batch, while the
 * elements are decided
 */
typedef struct BatchCall
{
	ArgsBatch	args;
	ProtocolBatch *batch;
} BatchCall;

/* Every element of keys is a valid key */
static void
check_keys(ArrayType *keys, int nkeys, BatchCall *bc)
{
	ArrayIterator it = walk(keys);
	Datum		value;

	for (int i = 0; i < nkeys; i++)
	{
		bc->args.element = i + 1;
		(void) next_element(it, &value);
		check_key_part(DatumGetTextPP(value), "key");
	}
	array_free_iterator(it);
	bc->args.element = 0;
}

/*
 * The claims of a batch, streamed into the result's tuplestore.  Each
 * element's memory (its fingerprint, the record read, the answer) lives in
 * the batch's element memory until the next element.
 */
static void
claim_elements(BatchCall *bc, ReturnSetInfo *rsinfo, IdemKey *key,
			   ArrayType *keys, int nkeys, ArrayType *fingerprints,
			   FingerprintKind kind, Interval *lease, Interval *retention)
{
	ArrayIterator key_it = walk(keys);
	ArrayIterator fp_it = walk(fingerprints);
	Datum		value;

	for (int i = 0; i < nkeys; i++)
	{
		MemoryContext old = MemoryContextSwitchTo(bc->args.memory);
		IdemFingerprint fp = {0};
		IdemAnswer	answer;
		Datum		values[8];
		bool		nulls[8];
		Datum		fp_value;

		bc->args.element = i + 1;
		(void) next_element(key_it, &value);
		key->key = DatumGetTextPP(value);
		if (next_element(fp_it, &fp_value))
			fingerprint_from_datum(fp_value, kind, &fp);

		protocol_batch_next(bc->batch);
		protocol_claim(bc->batch, key, &fp, false, lease, retention, NULL,
					   &answer);

		values[0] = PointerGetDatum(key->key);
		nulls[0] = false;
		answer_values(&answer, values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
		MemoryContextSwitchTo(old);
		MemoryContextReset(bc->args.memory);
	}
}

/*
 * idem_claim_many(tenant, endpoint, keys, fingerprints, lease, retention):
 * one row per element of keys, (key, then idem_claim's columns), in the
 * order of keys.  It never waits: a key another transaction holds is
 * in_progress at once.
 */
static Datum
claim_many(FunctionCallInfo fcinfo, FingerprintKind kind)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemKey		key;
	ArrayType  *keys;
	ArrayType  *fingerprints;
	int			nkeys;
	int			nfingerprints;
	Interval   *lease;
	Interval   *retention;
	BatchCall	bc;

	key.tenant = key_part_from_arg(fcinfo, 0, "tenant");
	key.endpoint = key_part_from_arg(fcinfo, 1, "endpoint");
	keys = array_from_arg(fcinfo, 2, "keys", false, false, &nkeys);
	fingerprints = array_from_arg(fcinfo, 3, "fingerprints", true, true,
								  &nfingerprints);
	require_length(fingerprints, "fingerprints", nfingerprints, nkeys);
	lease = arg_given(fcinfo, 4) ? PG_GETARG_INTERVAL_P(4) : NULL;
	retention = arg_given(fcinfo, 5) ? PG_GETARG_INTERVAL_P(5) : NULL;
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 8)
		elog(ERROR, "incorrect number of output arguments");
	args_batch_start(&bc.args, "idem_claim_many()");
	bc.batch = NULL;
	check_keys(keys, nkeys, &bc);
	tenant_check(key.tenant);

	bc.batch = protocol_batch_begin();
	claim_elements(&bc, rsinfo, &key, keys, nkeys, fingerprints, kind, lease,
				   retention);
	protocol_batch_end(bc.batch);
	args_batch_end(&bc.args);
	return (Datum) 0;
}

IDEM_SQL_FUNCTION(idem_claim_many, claim_many, FP_BYTEA);
IDEM_SQL_FUNCTION(idem_claim_many_text, claim_many, FP_TEXT);
IDEM_SQL_FUNCTION(idem_claim_many_jsonb, claim_many, FP_JSONB);

/* The element-wise arguments of idem_complete_many and idem_fail_many */
typedef struct FinishArrays
{
	int			nkeys;
	ArrayType  *keys;
	ArrayType  *statuses;
	ArrayType  *bodies;
	ArrayType  *attempts;
	ArrayType  *headers;
} FinishArrays;

/* One element of them, checked */
typedef struct FinishElement
{
	text	   *key;
	int32		status;
	bytea	   *body;
	bool		has_attempt;
	int32		attempt;
	Jsonb	   *headers;
} FinishElement;

/* A walk over all of them at once */
typedef struct FinishWalk
{
	ArrayIterator keys;
	ArrayIterator statuses;
	ArrayIterator bodies;
	ArrayIterator attempts;
	ArrayIterator headers;
} FinishWalk;

static void
finish_walk(const FinishArrays *arrays, FinishWalk *w)
{
	w->keys = walk(arrays->keys);
	w->statuses = walk(arrays->statuses);
	w->bodies = walk(arrays->bodies);
	w->attempts = walk(arrays->attempts);
	w->headers = walk(arrays->headers);
}

/*
 * The next element, checked as idem_complete checks its arguments.
 * Allocates in the current memory context.
 */
static void
finish_next(FinishWalk *w, FinishElement *e)
{
	Datum		value;

	(void) next_element(w->keys, &value);
	e->key = check_key_part(DatumGetTextPP(value), "key");
	(void) next_element(w->statuses, &value);
	e->status = check_status(DatumGetInt32(value));
	e->body = next_element(w->bodies, &value) ? DatumGetByteaPP(value) : NULL;
	e->has_attempt = next_element(w->attempts, &value);
	e->attempt = e->has_attempt ? check_attempt(DatumGetInt32(value)) : 0;
	e->headers = next_element(w->headers, &value) ?
		check_headers(DatumGetJsonbP(value)) : NULL;
	check_response_size(e->body, e->headers);
}

/*
 * Walk the elements, each checked as idem_complete checks its arguments:
 * before the protocol's batch begins, only to check every element before
 * the first one is finished; then to finish each.
 */
static void
finish_elements(BatchCall *bc, const FinishArrays *arrays, IdemKey *key,
				IdemFinish how)
{
	FinishWalk	w;
	FinishElement e;
	MemoryContext old;

	finish_walk(arrays, &w);
	old = MemoryContextSwitchTo(bc->args.memory);
	for (int i = 0; i < arrays->nkeys; i++)
	{
		bc->args.element = i + 1;
		finish_next(&w, &e);
		if (bc->batch != NULL)
		{
			key->key = e.key;
			protocol_batch_next(bc->batch);
			protocol_finish(bc->batch, key, how, e.has_attempt, e.attempt,
							true, e.status, e.body, e.headers);
		}
		MemoryContextReset(bc->args.memory);
	}
	MemoryContextSwitchTo(old);
	bc->args.element = 0;
}

/*
 * idem_complete_many (keys, statuses, bodies, attempts, headers) and
 * idem_fail_many (the same, with retryable after bodies): finish every
 * key's pending claim, in the order of keys, as idem_complete or idem_fail
 * would; returns how many were finished, which is every key, since a key
 * without a matching pending claim is an error (55000) of the whole call.
 * A NULL bodies, attempts or headers array gives no body, no fencing token
 * or no headers to every key, as a NULL element does to one.
 */
static Datum
finish_many(FunctionCallInfo fcinfo, bool failed)
{
	IdemKey		key;
	FinishArrays arrays;
	int			n;
	bool		retryable = false;
	IdemFinish	how;
	BatchCall	bc;

	key.tenant = key_part_from_arg(fcinfo, 0, "tenant");
	key.endpoint = key_part_from_arg(fcinfo, 1, "endpoint");
	arrays.keys = array_from_arg(fcinfo, 2, "keys", false, false,
								 &arrays.nkeys);
	arrays.statuses = array_from_arg(fcinfo, 3, "statuses", false, false, &n);
	require_length(arrays.statuses, "statuses", n, arrays.nkeys);
	arrays.bodies = array_from_arg(fcinfo, 4, "bodies", true, true, &n);
	require_length(arrays.bodies, "bodies", n, arrays.nkeys);
	if (failed)
		retryable = bool_from_arg(fcinfo, 5, "retryable");
	arrays.attempts = array_from_arg(fcinfo, failed ? 6 : 5, "attempts",
									 true, true, &n);
	require_length(arrays.attempts, "attempts", n, arrays.nkeys);
	arrays.headers = array_from_arg(fcinfo, failed ? 7 : 6, "headers",
									true, true, &n);
	require_length(arrays.headers, "headers", n, arrays.nkeys);

	how = !failed ? IDEM_FINISH_COMPLETE :
		retryable ? IDEM_FINISH_FAIL_RETRYABLE : IDEM_FINISH_FAIL;
	args_batch_start(&bc.args, failed ? "idem_fail_many()" : "idem_complete_many()");
	bc.batch = NULL;
	finish_elements(&bc, &arrays, &key, how);
	tenant_check(key.tenant);

	bc.batch = protocol_batch_begin();
	finish_elements(&bc, &arrays, &key, how);
	protocol_batch_end(bc.batch);
	args_batch_end(&bc.args);
	PG_RETURN_INT32(arrays.nkeys);
}

IDEM_SQL_FUNCTION(idem_complete_many, finish_many, false);
IDEM_SQL_FUNCTION(idem_fail_many, finish_many, true);
