/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  Request fingerprints and bodies given as bytes, text or jsonb.
 *
 * A fingerprint is stored as a SHA-256 digest, computed with PostgreSQL's
 * own cryptohash code, so that a record's size does not depend on the size
 * of the request it guards.  A jsonb value is reduced to jsonb's text form
 * first: jsonb already orders object keys and drops insignificant white
 * space, so two requests that differ only in those ways match.  Text and
 * jsonb are digested over their UTF-8 bytes whatever the database encoding,
 * so that a record restored into a database of another encoding still
 * matches its retries.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/jsonb.h"

#include "fingerprint.h"

StaticAssertDecl(IDEM_FINGERPRINT_LEN == PG_SHA256_DIGEST_LENGTH,
				 "a fingerprint is a SHA-256 digest");

void
fingerprint_bytes(const char *data, size_t len, IdemFingerprint *fp)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, fp->digest, sizeof(fp->digest)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute the SHA-256 digest of a request fingerprint")));
	pg_cryptohash_free(ctx);
	fp->present = true;
}

/* The digest of a text in the database encoding, over its UTF-8 form */
static void
fingerprint_utf8(const char *data, int len, IdemFingerprint *fp)
{
	char	   *utf8 = pg_server_to_any(data, len, PG_UTF8);

	fingerprint_bytes(utf8, utf8 == data ? (size_t) len : strlen(utf8), fp);
	if (utf8 != data)
		pfree(utf8);
}

void
fingerprint_text(text *t, IdemFingerprint *fp)
{
	fingerprint_utf8(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), fp);
}

/* The canonical text of a jsonb value, as a palloc'd StringInfo */
static void
jsonb_canonical(Datum jsonb, StringInfo out)
{
	Jsonb	   *jb = DatumGetJsonbP(jsonb);

	initStringInfo(out);
	JsonbToCString(out, &jb->root, VARSIZE(jb));
}

void
fingerprint_jsonb(Datum jsonb, IdemFingerprint *fp)
{
	StringInfoData buf;

	jsonb_canonical(jsonb, &buf);
	fingerprint_utf8(buf.data, buf.len, fp);
	pfree(buf.data);
}

/*
 * A jsonb response body is stored as its canonical text, the bytes a
 * client would have received had the body been sent as text.
 */
bytea *
jsonb_body(Datum jsonb)
{
	StringInfoData buf;
	bytea	   *result;

	jsonb_canonical(jsonb, &buf);
	result = (bytea *) palloc(VARHDRSZ + buf.len);
	SET_VARSIZE(result, VARHDRSZ + buf.len);
	memcpy(VARDATA(result), buf.data, buf.len);
	pfree(buf.data);
	return result;
}
