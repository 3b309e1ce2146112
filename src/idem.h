/*-------------------------------------------------------------------------
 *
 * idem.h
 *	  Types and prototypes shared by the rooms of the idem extension.
 *
 * A request flows one way: the SQL entry points (api.c) check arguments and
 * hand a key to the protocol (protocol.c), which decides over a record's
 * state and asks record.c, the only code that knows idem_record's columns,
 * to read or write it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_H
#define IDEM_H

#include "postgres.h"

#include "access/tupdesc.h"
#include "fmgr.h"
#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "compat.h"

/*
 * The oldest version of the extension's SQL objects that this library
 * serves: a library serves its own release's and the one before
 * (doc/operations.md, "Upgrading"); older ones are refused at
 * idem_extension_schema()
 */
#define IDEM_OLDEST_OBJECTS		"0.2.0"

/* SHA-256 digest length: the size of a stored request fingerprint */
#define IDEM_FINGERPRINT_LEN	32

/* Longest tenant, endpoint or key, in bytes */
#define IDEM_MAX_KEY_BYTES		255

/*
 * The number of buckets of idem_attempt_floor; its trigger and the SQL of
 * record_sql.c write it as "& 4095"
 */
#define IDEM_FLOOR_BUCKETS		4096

/* What a claim answers */
typedef enum IdemOutcome
{
	IDEM_CLAIMED,
	IDEM_REPLAY,
	IDEM_IN_PROGRESS,
	IDEM_MISMATCH,
	IDEM_UNKNOWN
} IdemOutcome;

#define IDEM_NUM_OUTCOMES	(IDEM_UNKNOWN + 1)

/* A record's state, as stored in idem_record.state */
typedef enum IdemState
{
	IDEM_PENDING,
	IDEM_SUCCEEDED,
	IDEM_FAILED
} IdemState;

/* The scope of a record: tenant + endpoint + key, all non-empty text */
typedef struct IdemKey
{
	text	   *tenant;
	text	   *endpoint;
	text	   *key;
} IdemKey;

/* An optional request fingerprint, already digested */
typedef struct IdemFingerprint
{
	bool		present;
	uint8		digest[IDEM_FINGERPRINT_LEN];
} IdemFingerprint;

/* The row idem_claim and idem_replay return */
typedef struct IdemAnswer
{
	IdemOutcome outcome;
	bool		has_record;		/* false: status..expires_at are NULL */
	bool		has_status;
	int32		status;
	bytea	   *body;
	Jsonb	   *headers;
	int32		attempt;
	TimestampTz created_at;
	TimestampTz lease_expires_at;	/* of an in_progress record; not returned */
	TimestampTz expires_at;
} IdemAnswer;

/* How a pending claim is finished */
typedef enum IdemFinish
{
	IDEM_FINISH_COMPLETE,		/* succeeded, replayed */
	IDEM_FINISH_FAIL,			/* failed, replayed */
	IDEM_FINISH_FAIL_RETRYABLE, /* failed, the next claim executes again */
	IDEM_FINISH_RELEASE			/* dropped, the next claim executes again */
} IdemFinish;

/*
 * A claim's wait for a committed pending claim of its key: the wake-up
 * slot's generation when it last looked (with idem preloaded), or the next
 * poll's sleep (without); and when lock_timeout ends the wait, from its
 * first sleep on
 */
typedef struct IdemWait
{
	uint64		generation;
	long		poll_ms;
	bool		slept;			/* lock_deadline is set */
	TimestampTz lock_deadline;
} IdemWait;

/*
 * Where a purge of one relation has got to, from one batch to the next:
 * the expiry the next batch starts at (DT_NOBEGIN at first), and the
 * buckets of the fencing floor that another transaction held when a batch
 * wanted them, whose records this purge leaves for a later one.
 */
typedef struct IdemPurgeScan
{
	TimestampTz from;
	bool		skip[IDEM_FLOOR_BUCKETS];
} IdemPurgeScan;

/* settings.c */
extern int	idem_retention;		/* seconds */
extern int	idem_retry_window;	/* seconds */
extern int	idem_lease;			/* milliseconds */
extern int	idem_max_retention; /* seconds, 0: no cap */
extern int	idem_max_lease;		/* milliseconds, 0: no cap */
extern int	idem_purge_interval;	/* milliseconds */
extern int	idem_purge_batch;	/* rows */
extern int	idem_max_body_size; /* kilobytes */
extern bool idem_log_outcomes;
extern bool idem_standby_replay;
extern bool idem_require_binding;
extern int	idem_outbox_retention;	/* seconds */
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_backoff;	/* milliseconds */
extern int	idem_outbox_backoff_max;	/* milliseconds */
extern void settings_init(void);
extern void settings_check_retention_rule(int elevel);
extern void settings_guard_alter_system(void);
extern int	settings_pin_search_path(Oid schema);

/* fingerprint.c */
extern void fingerprint_bytes(const char *data, size_t len,
							  IdemFingerprint *fp);
extern void fingerprint_text(text *t, IdemFingerprint *fp);
extern void fingerprint_jsonb(Datum jsonb, IdemFingerprint *fp);
extern bytea *jsonb_body(Datum jsonb);

/* keylock.c: the key lock of the SQL way into idem_record */
extern bool keylock_acquire(const IdemKey *key, bool wait,
							bool *already_held);
extern bool keylock_held_by_other(const IdemKey *key);
extern uint64 keylock_hash(const IdemKey *key);
extern void keylock_release(const IdemKey *key);

/* protocol.c */
typedef struct ProtocolBatch ProtocolBatch;
extern void protocol_claim(ProtocolBatch *batch, const IdemKey *key,
						   const IdemFingerprint *fp, bool wait,
						   Interval *lease, Interval *retention,
						   Interval *wait_timeout, IdemAnswer *answer);
extern bool protocol_replay(const IdemKey *key, const IdemFingerprint *fp,
							IdemAnswer *answer);
extern bool protocol_finish(ProtocolBatch *batch, const IdemKey *key,
							IdemFinish how, bool has_attempt, int32 attempt,
							bool has_status, int32 status, bytea *body,
							Jsonb *headers);
extern List *protocol_list(text *tenant, text *endpoint, bool with_body,
						   int32 max_rows, TupleDesc desc);
extern bool protocol_forget(const IdemKey *key);
extern ProtocolBatch *protocol_batch_begin(void);
extern void protocol_batch_next(ProtocolBatch *batch);
extern void protocol_batch_end(ProtocolBatch *batch);
extern const char *outcome_name(IdemOutcome outcome);
extern void require_primary(const char *function);
extern void require_primary_for(const char *function, Oid relid,
								const char *table);
extern TimestampTz protocol_lease_end(const char *who, TimestampTz now,
									  Interval *lease);
extern TimestampTz protocol_time_plus(TimestampTz now, Interval *span,
									  const char *name);
extern void protocol_check_cap(const char *who, const char *what,
							   TimestampTz now, TimestampTz end, int64 cap_us,
							   Interval *given, const char *setting,
							   const char *cap_setting);

/* api.c: argument checks that outbox.c's SQL functions share */
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

/* outbox.c */
extern Oid	outbox_relation(void);
extern bool outbox_subscribed(void);
extern uint64 outbox_purge_batch(TimestampTz now, int batch, bool *more);

/* purge.c */
extern List *purge_targets(bool *distributed);
extern uint64 purge_batch(Oid target, TimestampTz now, IdemPurgeScan *scan,
						  bool *more);
extern uint64 purge_all(void);

/* stats.c */
extern void stats_init(void);
extern void stats_count_claim(IdemOutcome outcome);
extern void stats_count_finish(IdemFinish how);
extern void stats_count_purge(uint64 rows, TimestampTz start, TimestampTz end,
							  bool backlog);
extern bool stats_purge_backlog(Oid dbid);

/* wait.c */
extern void wait_init(void);
extern void wait_key_finished(const IdemKey *key);
extern void wait_prepare(const IdemKey *key, IdemWait *w);
extern void wait_sleep(const IdemKey *key, TimestampTz until, IdemWait *w);

/* subscription.c */
extern Oid	subscription_of_records(void);
extern Oid	subscription_of(Oid relid);

/* tenant.c */
extern Oid	idem_extension_schema(void);
extern void tenant_check(const text *tenant);
extern text *tenant_bound(void);

/* worker.c */
extern void worker_register_launcher(void);

#endif							/* IDEM_H */
