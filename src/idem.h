/*-------------------------------------------------------------------------
 *
 * idem.h
 *	  The types that the rooms of the idem extension share, and nothing
 *	  else: each room declares what others may call in a header of its own.
 *
 * A request flows one way, and the #include lines show it: the SQL entry
 * points (api.c, outbox.c: args.h, protocol.h) check arguments and hand a key to the
 * protocol (protocol.c: record.h, stats.h, wait.h), which decides over a
 * record's state and asks the record room (record.c, record_sql.c:
 * record_way.h, access.h), the only code that knows idem_record's columns,
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

/*
 * A list of named things, written once as LIST(X) with one X(CONSTANT,
 * name) per thing, gives an enum (LIST(IDEM_AS_ENUM)) and the names
 * indexed by it (LIST(IDEM_AS_NAME)): a constant and its name cannot drift
 * apart.
 */
#define IDEM_AS_ENUM(constant, name) constant,
#define IDEM_AS_NAME(constant, name) [constant] = #name,

/* The enum type of list, with count after its last constant, and names */
#define IDEM_NAMED_ENUM(type, list, count, names) \
typedef enum type \
{ \
	list(IDEM_AS_ENUM) \
	count \
} type; \
static const char *const names[count] = { \
	list(IDEM_AS_NAME) \
}

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
	IDEM_UNKNOWN,
	IDEM_FROZEN					/* 0.4.0 */
} IdemOutcome;

#define IDEM_NUM_OUTCOMES	(IDEM_FROZEN + 1)

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

#endif							/* IDEM_H */
