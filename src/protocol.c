/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  Claim, finish and replay as decisions over a record's state, and the
 *	  operator's listing and forgetting of records.
 *
 * The protocol holds no SQL: it reads a record through record.c, decides
 * over its state, and asks record.c to write the outcome.  What makes two
 * concurrent claims of one key never both "claimed" is the unique index
 * (record_insert_claim); what makes a claim answer in_progress instead of
 * waiting for an uncommitted claim is record_probe, which sees another
 * transaction writing the key's record without waiting for it.  A write
 * acts on the version that the probe found, and only if it is still the
 * newest when record.c locks it: otherwise the protocol probes and decides
 * again.
 *
 * A claim with wait => true that finds a committed pending claim waits
 * until it finishes (wait.c), then decides again over what it left.
 *
 * A finished record never changes until it expires, so a claim that finds
 * one replays it from its own snapshot, without locking or writing
 * anything: a retry of a finished request costs one index look-up.
 *
 * "Now" is the clock at the moment of each call (GetCurrentTimestamp), not
 * the start of the statement, transaction or CALL: a procedure that claims
 * and commits message after message, or a claim late in a long statement,
 * gets a lease and an expiry that count from the claim itself.  And not
 * the start of the call either when the call waited (for another
 * transaction, or a row lock): it is read again after every probe, and a
 * write that had to wait makes the protocol probe again, so every
 * timestamp written is taken after the last wait.
 *
 * A pending claim whose lease runs is live whatever its expiry says
 * (record_expired): it is never re-claimed as new, finished as forgotten or
 * purged.  Claims give it an expiry no earlier than its lease's end anyway;
 * the rule also covers records written by idem 0.1.0.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_subscription.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "decisions.h"
#include "freeze.h"
#include "protocol.h"
#include "record.h"
#include "settings.h"
#include "stats.h"
#include "subscription.h"
#include "wait.h"

/* A batch's shared state: protocol_batch_begin() */
struct ProtocolBatch
{
	RecordAccess *records;
	bool		fresh;			/* its last claim inserted a fresh record */
};

const char *
outcome_name(IdemOutcome outcome)
{
	static const char *const names[] = {
		[IDEM_CLAIMED] = "claimed",
		[IDEM_REPLAY] = "replay",
		[IDEM_IN_PROGRESS] = "in_progress",
		[IDEM_MISMATCH] = "mismatch",
		[IDEM_UNKNOWN] = "unknown",
		[IDEM_FROZEN] = "frozen"
	};

	return names[outcome];
}

/* The name of subscription subid, for messages */
static char *
subscription_name(Oid subid)
{
	char	   *name = get_subscription_name(subid, true);

	return name ? name : psprintf("%u", subid);
}

/*
 * Decisions are taken on the primary only: a standby's copy may lag, and a
 * decision taken on it could execute a request twice.  Nor are they taken
 * on a logical-replication subscriber that receives idem_record
 * (subscription.c): its records are the publisher's, and a key written on
 * both sides would stop the subscription.
 */
static void
refuse_unless_primary(const char *function, Oid subid, const char *table)
{
	if (OidIsValid(subid))
	{
		char	   *name = subscription_name(subid);

		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call %s on a logical replication subscriber of table \"%s\"",
						function, table),
				 errdetail("Subscription \"%s\" replicates %s into this database; a decision taken here would conflict with the publisher's.",
						   name, table),
				 errhint("Idempotency decisions need the publisher of subscription \"%s\": connect to it.",
						 name)));
	}
	PreventCommandIfReadOnly(function);
}

void
require_primary(const char *function)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call %s during recovery", function),
				 errhint("Idempotency decisions need the primary server: connect to it.")));
	refuse_unless_primary(function, subscription_of_records(), "idem_record");
}

/* The same for a decision over another table of idem's (the outbox) */
void
require_primary_for(const char *function, Oid relid, const char *table)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call %s during recovery", function),
				 errhint("Idempotency decisions need the primary server: connect to it.")));
	refuse_unless_primary(function, subscription_of(relid), table);
}

/* Why a finish found no matching pending claim */
typedef enum NotPending
{
	NOT_LIVE,					/* no record, or an expired one */
	NOT_CURRENT,				/* the fencing token is another attempt's */
	NOT_SUCCEEDED,				/* the attempt has succeeded already */
	NOT_FAILED					/* ... or failed */
} NotPending;

pg_noreturn static void report_not_pending(const IdemKey *key,
											const char *function,
											NotPending why, int32 attempt);

/* The one place that raises "no matching pending claim" (55000) */
static void
report_not_pending(const IdemKey *key, const char *function, NotPending why,
				   int32 attempt)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s: idem key \"%s\" of endpoint \"%s\" (tenant \"%s\") has no matching pending claim",
					function, text_to_cstring(key->key),
					text_to_cstring(key->endpoint),
					text_to_cstring(key->tenant)),
			 why == NOT_LIVE ?
			 errdetail("The key has no live record.") :
			 why == NOT_CURRENT ?
			 errdetail("Attempt %d is not the key's current attempt.", attempt) :
			 why == NOT_SUCCEEDED ?
			 errdetail("The record of attempt %d has succeeded.", attempt) :
			 errdetail("The record of attempt %d has failed.", attempt)));
}

static bool
is_final(const IdemRecord *rec)
{
	return rec->state == IDEM_SUCCEEDED ||
		(rec->state == IDEM_FAILED && !rec->retryable);
}

/* A record that claims treat as absent: expired, and not a running lease */
static bool
record_expired(const IdemRecord *rec, TimestampTz now)
{
	return rec->expires_at <= now &&
		!(rec->state == IDEM_PENDING && rec->lease_expires_at > now);
}

static bool
fingerprints_differ(const IdemFingerprint *a, const IdemFingerprint *b)
{
	return a->present && b->present &&
		memcmp(a->digest, b->digest, IDEM_FINGERPRINT_LEN) != 0;
}

/*
 * The caller is about to act on the newest version of a key's record (or
 * on its absence).  Under REPEATABLE READ and SERIALIZABLE the
 * transaction's snapshot must show that same version (the probe tells,
 * rec->visible), or show no record when there is none (have_snap tells
 * whether it shows one): anything the caller wrote or answered would
 * otherwise rest on a record its transaction cannot see.
 */
static void
check_version(const IdemKey *key, bool have_snap, bool found,
			  const IdemRecord *rec)
{
	if (IsolationUsesXactSnapshot() &&
		(found ? !rec->visible : have_snap))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access to idem key \"%s\" due to a concurrent change",
						text_to_cstring(key->key)),
				 errdetail("Another transaction changed the key's record after this transaction's snapshot was taken."),
				 errhint("Retry the transaction.")));
}

static void
answer_with(IdemAnswer *answer, IdemOutcome outcome, const IdemRecord *rec)
{
	answer->outcome = outcome;
	answer->has_record = true;
	answer->has_status = outcome == IDEM_REPLAY && rec->has_status;
	answer->status = rec->status;
	answer->body = outcome == IDEM_REPLAY ? rec->body : NULL;
	answer->headers = outcome == IDEM_REPLAY ? rec->headers : NULL;
	answer->attempt = rec->attempt;
	answer->created_at = rec->created_at;
	answer->lease_expires_at = rec->lease_expires_at;
	answer->expires_at = rec->expires_at;
}

/* What a claim answers for a live record that it will not re-execute */
static IdemOutcome
settled_outcome(const IdemRecord *rec, const IdemFingerprint *fp,
				TimestampTz now)
{
	if (fingerprints_differ(&rec->fingerprint, fp))
		return IDEM_MISMATCH;
	if (is_final(rec))
		return IDEM_REPLAY;
	return rec->lease_expires_at > now ? IDEM_IN_PROGRESS : IDEM_UNKNOWN;
}

/*
 * now + span, for a claim's lease, retention or wait_timeout (name).  An
 * interval that takes the sum out of timestamptz's range is a bad argument
 * (22023), not the datetime overflow (22008) that timestamptz_pl_interval
 * would raise, so it is refused before it is added.  The sum is estimated
 * after each step of that addition (months, then days, then the time),
 * counting a month as a twelfth of a Julian year: over the whole range the
 * estimate is a few years off at most, and the margin is a century.  An
 * infinite interval (PostgreSQL 17+) gives an infinite timestamp.
 */
TimestampTz
protocol_time_plus(TimestampTz now, Interval *span, const char *name)
{
	if (idem_interval_is_finite(span))
	{
		const double margin = 100 * DAYS_PER_YEAR * USECS_PER_DAY;
		const double steps[3] = {
			(double) span->month * (DAYS_PER_YEAR / MONTHS_PER_YEAR) * USECS_PER_DAY,
			(double) span->day * USECS_PER_DAY,
			(double) span->time
		};
		double		sum = (double) now;

		for (int i = 0; i < 3; i++)
		{
			sum += steps[i];
			if (sum < (double) MIN_TIMESTAMP + margin ||
				sum > (double) END_TIMESTAMP - margin)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s %s is out of range", name,
								DatumGetCString(DirectFunctionCall1(interval_out,
																	PointerGetDatum(span)))),
						 errdetail("Added to the current time, it leaves the range of timestamp with time zone.")));
		}
	}
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(now),
												   PointerGetDatum(span)));
}

/*
 * A DBA's cap on a claim's lease or retention (idem.max_lease,
 * idem.max_retention; 0: none): the span from now to end, asked for by the
 * claim's argument given or else by the setting named, may not be longer.
 * It binds every role, whatever asks for the span, and errors before
 * anything is written; the message names both values.
 */
void
protocol_check_cap(const char *who, const char *what, TimestampTz now,
				   TimestampTz end, int64 cap_us, Interval *given,
				   const char *setting, const char *cap_setting)
{
	settings_require_readable();
	if (cap_us <= 0 || (!TIMESTAMP_IS_NOEND(end) && end - now <= cap_us))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s %s is longer than %s (%s)", what,
					given != NULL ?
					DatumGetCString(DirectFunctionCall1(interval_out,
														PointerGetDatum(given))) :
					GetConfigOptionByName(setting, NULL, false),
					cap_setting, GetConfigOptionByName(cap_setting, NULL, false)),
			 given != NULL ?
			 errdetail("The %s's %s argument asks for it.", who, what) :
			 errdetail("The setting %s asks for it.", setting),
			 errhint("Ask for a shorter %s, or have a superuser raise %s.",
					 what, cap_setting)));
}

/*
 * The end of a lease that who (a claim, a take) takes at now: its lease
 * argument, or idem.lease; an error for one that is not positive or is
 * over idem.max_lease
 */
TimestampTz
protocol_lease_end(const char *who, TimestampTz now, Interval *lease)
{
	TimestampTz end;

	if (lease != NULL)
		end = protocol_time_plus(now, lease, "lease");
	else
		end = now + (TimestampTz) idem_lease * 1000;
	if (end <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive"),
				 errdetail("The lease given was %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(lease))))));
	protocol_check_cap(who, "lease", now, end, (int64) idem_max_lease * 1000,
					   lease, "idem.lease", "idem.max_lease");
	return end;
}

/*
 * The lease's end and the expiry of a claim made at now, or an error for a
 * bad lease or retention, or one over the DBA's caps.  The expiry is the
 * retention (the claim's own, or idem.retention) after now, but never
 * before the lease ends, so that a record cannot be forgotten while its
 * lease runs; a lease that would end after idem.max_retention would so
 * keep the record longer than the cap, and is refused as a retention is.
 */
static void
claim_times(TimestampTz now, Interval *lease, Interval *retention,
			TimestampTz *lease_expires_at, TimestampTz *expires_at)
{
	*lease_expires_at = protocol_lease_end("claim", now, lease);
	protocol_check_cap("claim", "lease", now, *lease_expires_at,
					   (int64) idem_max_retention * USECS_PER_SEC, lease,
					   "idem.lease", "idem.max_retention");
	if (retention != NULL)
	{
		*expires_at = protocol_time_plus(now, retention, "retention");
		/* an infinite interval (PostgreSQL 17+) gives an infinite expiry */
		if (TIMESTAMP_IS_NOBEGIN(*expires_at) ||
			(!TIMESTAMP_IS_NOEND(*expires_at) &&
			 *expires_at - now <= (TimestampTz) idem_retry_window * USECS_PER_SEC))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("retention %s must be longer than idem.retry_window (%ds)",
							DatumGetCString(DirectFunctionCall1(interval_out,
																PointerGetDatum(retention))),
							idem_retry_window),
					 errdetail("A retry that arrives after its record expired would execute the request again.")));
	}
	else
		*expires_at = now + (TimestampTz) idem_retention * USECS_PER_SEC;
	protocol_check_cap("claim", "retention", now, *expires_at,
			  (int64) idem_max_retention * USECS_PER_SEC, retention,
			  "idem.retention", "idem.max_retention");
	*expires_at = Max(*expires_at, *lease_expires_at);
}

/*
 * The answer when another transaction is writing the key's record: what
 * the snapshot shows of the record, or in_progress without one.
 */
static void
answer_busy(const IdemFingerprint *fp, bool have_snap, const IdemRecord *snap,
			TimestampTz now, IdemAnswer *answer)
{
	if (have_snap && !record_expired(snap, now))
		answer_with(answer,
					fingerprints_differ(&snap->fingerprint, fp) ?
					IDEM_MISMATCH : IDEM_IN_PROGRESS, snap);
	else
	{
		memset(answer, 0, sizeof(*answer));
		answer->outcome = IDEM_IN_PROGRESS;
	}
}

/* What a claim that executes stores as its record's trace: idem.trace */
static const char *
claim_trace(void)
{
	return idem_trace != NULL && idem_trace[0] != '\0' ? idem_trace : NULL;
}

/* The answer of a claim that would execute a frozen endpoint's request */
static void
answer_frozen(IdemAnswer *answer)
{
	memset(answer, 0, sizeof(*answer));
	answer->outcome = IDEM_FROZEN;
}

/*
 * Claim a key once.  The answer says whether the caller now owns it
 * ("claimed": execute, then finish it) or what to tell the client.  Only a
 * "claimed" answer leaves anything behind: the pending record, gone if the
 * transaction rolls back.  *own_claim tells whether the record is this
 * transaction's own.
 *
 * A probe or a write may wait for another transaction (one writing or
 * deleting the key's record, or holding its row lock), and a write that
 * waited makes the protocol probe again.  So "now", and every timestamp
 * derived from it, is taken after each probe: a claim's lease and expiry
 * count from the moment it claims, not from before a wait.
 */
static void
claim_once(ProtocolBatch *batch, const IdemKey *key, const IdemFingerprint *fp,
		   bool wait, Interval *lease, Interval *retention,
		   IdemAnswer *answer, bool *own_claim)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_expires_at;
	TimestampTz expires_at;
	RecordAccess *ra;
	IdemRecord	snap;
	IdemRecord	rec;
	bool		have_snap;
	bool		probed = false;
	RecordProbe found = RECORD_ABSENT;
	bool		inserted = false;

	*own_claim = false;
	ra = record_open(batch != NULL ? batch->records : NULL);

	/*
	 * In a batch whose last claim inserted a fresh record (a consumer's
	 * batch of new messages), the insert comes first: its unique check is
	 * the one look at the key, and only a conflict makes the claim look at
	 * what the key holds, below.  Where the probe stands for the snapshot
	 * (record_probe_shows_snapshot), an insert that wins decides exactly
	 * as a probe that finds the key absent followed by the insert would.
	 * A guess that fails leaves a dead tuple, and the next claim of the
	 * batch looks first again.  A batch's first claim looks first: a batch
	 * of replays (a consumer's redelivered batch) writes nothing at all.
	 * Where the table has a unique index besides the key's arbiters (a
	 * DBA's), an insert would wait on it or fail where a look replays, so
	 * there every claim looks first (record_may_insert_first).
	 */
	if (batch != NULL && batch->fresh && record_may_insert_first(ra))
	{
		record_prepare_write(ra);
		now = GetCurrentTimestamp();
		claim_times(now, lease, retention, &lease_expires_at, &expires_at);
		if (!freeze_holds(key, now) &&
			record_insert_claim(ra, key, fp, now, lease_expires_at,
								expires_at, claim_trace(), &rec.attempt))
		{
			rec.created_at = now;
			rec.lease_expires_at = lease_expires_at;
			rec.expires_at = expires_at;
			answer_with(answer, IDEM_CLAIMED, &rec);
			record_close(ra);
			return;
		}
		batch->fresh = false;
	}

	/*
	 * Where a settled probe stands for what the snapshot shows, one look
	 * serves the replay below and the loop's first decision: one descent of
	 * the key index instead of two.  A key another transaction is writing
	 * is read with the snapshot too, for answer_busy.
	 */
	if (record_probe_shows_snapshot(ra))
	{
		found = record_probe(ra, key, false, RECORD_FOR_CLAIM, &rec,
							 own_claim);
		probed = found != RECORD_BUSY;
	}
	if (probed)
	{
		have_snap = found == RECORD_FOUND;
		if (have_snap)
			snap = rec;
	}
	else
		have_snap = record_fetch(ra, key, &snap);

	/* A finished record is final: replay it without locking anything. */
	if (have_snap && !record_expired(&snap, now) && is_final(&snap))
	{
		answer_with(answer, settled_outcome(&snap, fp, now), &snap);
		record_close(ra);
		return;
	}
	/* the write's locks may wait: before the clock is read below */
	record_prepare_write(ra);

	for (;;)
	{
		IdemRecord	next;
		bool		early = probed;

		CHECK_FOR_INTERRUPTS();

		/*
		 * The write's locks may have waited since the first look: a write
		 * finds out whether that look was stale (the insert's conflict, the
		 * lock's RECORD_CHANGED), but an answer that writes nothing would
		 * rest on it, so such an answer looks again first.
		 */
		if (!early)
			found = record_probe(ra, key, wait, RECORD_FOR_CLAIM, &rec,
								 own_claim);
		probed = false;
		now = GetCurrentTimestamp();
		claim_times(now, lease, retention, &lease_expires_at, &expires_at);

		if (found == RECORD_BUSY)
		{
			answer_busy(fp, have_snap, &snap, now, answer);
			break;
		}
		if (found == RECORD_ABSENT)
		{
			if (freeze_holds(key, now))
			{
				if (early)
					continue;
				answer_frozen(answer);
				break;
			}
			if (record_insert_claim(ra, key, fp, now, lease_expires_at,
									expires_at, claim_trace(),
									&rec.attempt))
			{
				rec.created_at = now;
				rec.lease_expires_at = lease_expires_at;
				rec.expires_at = expires_at;
				answer_with(answer, IDEM_CLAIMED, &rec);
				inserted = true;
				break;
			}
			continue;			/* another transaction inserted it first */
		}

		check_version(key, have_snap, true, &rec);
		next = rec;
		if (record_expired(&rec, now))
		{
			/* forgotten: a first claim again, but fenced above the old one */
			next.fingerprint = *fp;
			next.attempt++;
			next.created_at = now;
		}
		else if (rec.state == IDEM_FAILED && rec.retryable &&
				 !fingerprints_differ(&rec.fingerprint, fp))
		{
			/* a system error or a release: execute again, fenced */
			next.attempt++;
			if (!rec.fingerprint.present)
				next.fingerprint = *fp;
		}
		else
		{
			if (early)
				continue;
			answer_with(answer, settled_outcome(&rec, fp, now), &rec);
			break;
		}

		if (freeze_holds(key, now))
		{
			if (early)
				continue;
			answer_frozen(answer);
			break;
		}
		next.state = IDEM_PENDING;
		next.trace = claim_trace();
		next.retryable = false;
		next.has_status = false;
		next.body = NULL;
		next.headers = NULL;
		next.lease_expires_at = lease_expires_at;
		next.expires_at = expires_at;
		switch (record_write(ra, key, &rec, &next, now, wait))
		{
			case RECORD_WRITTEN:
				answer_with(answer, IDEM_CLAIMED, &next);
				break;
			case RECORD_WRITE_BUSY:
				answer_busy(fp, have_snap, &snap, now, answer);
				break;
			case RECORD_CHANGED:
				continue;
		}
		break;
	}

	if (answer->outcome != IDEM_CLAIMED)
		record_unlock(ra, key);
	if (batch != NULL)
		batch->fresh = inserted;
	record_close(ra);
}

/*
 * Claim a key.  Without wait, or when the key is not held by a committed
 * pending claim of another transaction, that is one claim_once.  With wait,
 * a committed pending claim within its lease is waited for (wait.c) until
 * it is finished, or its lease or the caller's wait_timeout runs out (or
 * lock_timeout, an error), and the key is then claimed again as of the
 * time it woke: "replay", "claimed" (it failed retryably or was released),
 * "unknown" (its lease ran out), or "in_progress" when wait_timeout passed
 * first.
 *
 * The intervals are checked here, before anything is looked at or waited
 * for; claim_once takes the times it writes again after every wait.
 */
static void
claim(ProtocolBatch *batch, const IdemKey *key, const IdemFingerprint *fp,
	  bool wait, Interval *lease, Interval *retention, Interval *wait_timeout,
	  IdemAnswer *answer)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_expires_at;
	TimestampTz expires_at;
	TimestampTz deadline = DT_NOEND;
	IdemWait	w = {0};
	bool		own_claim;

	settings_check_retention_rule(ERROR);
	require_primary("idem_claim()");
	claim_times(now, lease, retention, &lease_expires_at, &expires_at);
	if (wait_timeout != NULL)
	{
		deadline = protocol_time_plus(now, wait_timeout, "wait_timeout");
		if (deadline < now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("wait_timeout must not be negative"),
					 errdetail("The wait_timeout given was %s.",
							   DatumGetCString(DirectFunctionCall1(interval_out,
																   PointerGetDatum(wait_timeout))))));
	}

	for (;;)
	{
		if (wait)
			wait_prepare(key, &w);
		claim_once(batch, key, fp, wait, lease, retention, answer,
				   &own_claim);
		if (!wait || own_claim || answer->outcome != IDEM_IN_PROGRESS ||
			!answer->has_record || GetCurrentTimestamp() >= deadline)
			return;
		wait_sleep(key, Min(answer->lease_expires_at, deadline), &w);
	}
}

/*
 * The claim's log line (decisions.c): every request of one intent can be
 * found in the server log by grepping for its key or its trace id
 */
static void
log_claim(const IdemKey *key, const IdemAnswer *answer)
{
	char		attempt[16] = "";

	if (answer->has_record)
		snprintf(attempt, sizeof(attempt), "%d", answer->attempt);
	decisions_log("claim", key, "endpoint", "outcome=%s attempt=%s",
				  outcome_name(answer->outcome), attempt);
}

/*
 * Claim a key, with its statistics and its log line; batch is NULL, or the
 * batch that the claim is an element of
 */
void
protocol_claim(ProtocolBatch *batch, const IdemKey *key,
			   const IdemFingerprint *fp, bool wait, Interval *lease,
			   Interval *retention, Interval *wait_timeout,
			   IdemAnswer *answer)
{
	claim(batch, key, fp, wait, lease, retention, wait_timeout, answer);
	stats_count_claim(answer->outcome);
	if (decisions_logged(answer->outcome == IDEM_IN_PROGRESS ||
						 answer->outcome == IDEM_MISMATCH ||
						 answer->outcome == IDEM_UNKNOWN ||
						 answer->outcome == IDEM_FROZEN))
		log_claim(key, answer);
}

/*
 * Batches: idem_claim_many, idem_complete_many and idem_fail_many decide
 * each element with protocol_claim or protocol_finish, exactly as one call
 * per element in the array's order would, passing them the batch that
 * protocol_batch_begin() returned, up to protocol_batch_end();
 * protocol_batch_next() comes before each element.  What the batch shares
 * is set up once: a bracket of the record room (record_batch_open).
 *
 * One call per element in one transaction would run as statements of
 * their own, each seeing what the earlier ones wrote.  A batch is one
 * statement, whose snapshot would not: so it acts under a copy of the
 * active snapshot whose command id moves on before each element.  A key
 * that the array repeats is then, at its second occurrence, this
 * transaction's own pending claim, in_progress as for a second idem_claim,
 * and not (under REPEATABLE READ) a record that the snapshot misses.
 *
 * Nothing here is per key but the decision itself: no lock is kept, and
 * the caller resets its memory after each element.  An error needs no
 * clean-up: the abort pops the snapshot and closes the bracket's
 * relations, and the batch is memory of the caller's context.
 */
ProtocolBatch *
protocol_batch_begin(void)
{
	ProtocolBatch *batch = palloc(sizeof(ProtocolBatch));

	PushCopiedSnapshot(GetActiveSnapshot());
	batch->records = record_batch_open();
	batch->fresh = false;
	return batch;
}

void
protocol_batch_next(ProtocolBatch *batch)
{
	CHECK_FOR_INTERRUPTS();
	UpdateActiveSnapshotCommandId();
}

void
protocol_batch_end(ProtocolBatch *batch)
{
	record_batch_close(batch->records);
	PopActiveSnapshot();
	pfree(batch);
}

/*
 * What a claim would answer, without claiming and without writing: false
 * when a claim would execute (no live record, or one that failed retryably
 * or was released).  A key whose record another transaction is writing is
 * in_progress, as for a claim: that transaction may be inserting a claim
 * that no snapshot shows yet.  Nothing is locked or waited for.  On a
 * standby or a subscriber of idem_record (idem.standby_replay) no
 * transaction of the primary can be seen writing, so there the answer
 * rests on the records alone.
 */
bool
protocol_replay(const IdemKey *key, const IdemFingerprint *fp,
				IdemAnswer *answer)
{
	TimestampTz now = GetCurrentTimestamp();
	RecordAccess *ra;
	IdemRecord	rec;
	bool		found;
	bool		busy;
	bool		recovery = RecoveryInProgress();
	Oid			subid = recovery ? InvalidOid : subscription_of_records();

	if (recovery && !idem_standby_replay)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call idem_replay() during recovery"),
				 errdetail("A standby's records may lag the primary's."),
				 errhint("Ask the primary, or set idem.standby_replay to accept the lag.")));
	if (OidIsValid(subid) && !idem_standby_replay)
	{
		char	   *name = subscription_name(subid);

		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call idem_replay() on a logical replication subscriber of table \"idem_record\""),
				 errdetail("Subscription \"%s\" replicates idem_record into this database; its records may lag the publisher's.",
						   name),
				 errhint("Ask the publisher of subscription \"%s\", or set idem.standby_replay to accept the lag.",
						 name)));
	}

	ra = record_open(NULL);
	found = record_fetch(ra, key, &rec);
	busy = !(found && !record_expired(&rec, now) && is_final(&rec)) &&
		!recovery && !OidIsValid(subid) && record_busy(ra, key);
	record_close(ra);

	if (found && !record_expired(&rec, now) && is_final(&rec))
	{
		answer_with(answer, settled_outcome(&rec, fp, now), &rec);
		return true;
	}
	if (busy)
	{
		answer_busy(fp, found, &rec, now, answer);
		return true;
	}
	if (!found || record_expired(&rec, now) ||
		(rec.state == IDEM_FAILED && rec.retryable &&
		 !fingerprints_differ(&rec.fingerprint, fp)))
	{
		if (!freeze_holds(key, now))
			return false;
		answer_frozen(answer);
		return true;
	}
	answer_with(answer, settled_outcome(&rec, fp, now), &rec);
	return true;
}

/*
 * Finish the key's pending claim: complete it, fail it, or release it.
 * With an attempt, only that attempt may be finished (a fencing token: a
 * worker that outlived its lease cannot finish a later attempt).  Returns
 * false only for a release of a claim that was already released, so that a
 * reconciliation job may safely release twice.
 */
bool
protocol_finish(ProtocolBatch *batch, const IdemKey *key, IdemFinish how,
				bool has_attempt, int32 attempt, bool has_status,
				int32 status, bytea *body, Jsonb *headers)
{
	static const char *const function_names[] = {
		[IDEM_FINISH_COMPLETE] = "idem_complete()",
		[IDEM_FINISH_FAIL] = "idem_fail()",
		[IDEM_FINISH_FAIL_RETRYABLE] = "idem_fail()",
		[IDEM_FINISH_RELEASE] = "idem_release()"
	};
	const char *function = function_names[how];
	RecordAccess *ra;
	IdemRecord	snap;
	IdemRecord	rec;
	bool		have_snap = false;

	require_primary(function);
	ra = record_open(batch != NULL ? batch->records : NULL);
	/* the write's locks may wait: before the clock is read below */
	record_prepare_write(ra);
	if (IsolationUsesXactSnapshot())
		have_snap = record_fetch(ra, key, &snap);

	for (;;)
	{
		bool		found;
		TimestampTz now;
		IdemRecord	next;

		CHECK_FOR_INTERRUPTS();
		found = record_probe(ra, key, true, RECORD_FOR_FINISH, &rec,
							 NULL) == RECORD_FOUND;
		/* the probe or the last write may have waited: now is after it */
		now = GetCurrentTimestamp();

		check_version(key, have_snap, found, &rec);
		if (!found || record_expired(&rec, now))
			report_not_pending(key, function, NOT_LIVE, 0);
		if (has_attempt && attempt != rec.attempt)
			report_not_pending(key, function, NOT_CURRENT, attempt);
		if (rec.state != IDEM_PENDING)
		{
			if (how == IDEM_FINISH_RELEASE &&
				rec.state == IDEM_FAILED && rec.retryable)
			{
				/* nothing written: claims need not wait for this one */
				record_unlock(ra, key);
				record_close(ra);
				return false;
			}
			report_not_pending(key, function,
							   rec.state == IDEM_SUCCEEDED ?
							   NOT_SUCCEEDED : NOT_FAILED, rec.attempt);
		}
		next = rec;
		next.state = how == IDEM_FINISH_COMPLETE ? IDEM_SUCCEEDED : IDEM_FAILED;
		next.retryable = how == IDEM_FINISH_FAIL_RETRYABLE ||
			how == IDEM_FINISH_RELEASE;
		next.has_status = has_status;
		next.status = status;
		next.body = body;
		next.headers = headers;
		if (record_write(ra, key, &rec, &next, now, true) == RECORD_WRITTEN)
			break;
	}
	record_close(ra);
	stats_count_finish(how);
	wait_key_finished(key);
	return true;
}

/* The operator listing: a tenant's records, newest state, no decision */
List *
protocol_list(text *tenant, text *endpoint, bool with_body, int32 max_rows,
			  TupleDesc desc)
{
	RecordAccess *ra = record_open(NULL);
	List	   *rows;

	rows = record_list(ra, tenant, endpoint, with_body, max_rows, desc);
	record_close(ra);
	return rows;
}

/*
 * The suspects of duplicates since since ago (idem_suspects): keys made
 * anew for every retry of one request, or two layers each retrying, as
 * groups of one fingerprint under two or more keys, each first claimed
 * within within of another.  Of tenant only, if not NULL.  Reports, never
 * merges: two equal requests may be two intents.
 */
List *
protocol_suspects(Interval *since, Interval *within, text *tenant,
				  TupleDesc desc)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz from = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
															   TimestampTzGetDatum(now),
															   PointerGetDatum(since)));
	RecordAccess *ra = record_open(NULL);
	List	   *rows;

	rows = record_suspects(ra, from, within, tenant, now, desc);
	record_close(ra);
	return rows;
}

/*
 * Forget a key, whatever its state: the next claim executes as a first
 * claim.  An operator's tool, for a record that must not be replayed.  It
 * waits for a transaction that is writing the key.
 */
bool
protocol_forget(const IdemKey *key)
{
	RecordAccess *ra;
	bool		forgotten;

	require_primary("idem_forget()");
	ra = record_open(NULL);
	forgotten = record_forget(ra, key);
	if (!forgotten)
		record_unlock(ra, key);
	record_close(ra);
	if (forgotten)
		wait_key_finished(key);
	return forgotten;
}
