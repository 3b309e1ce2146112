/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *	  Request fingerprints (SHA-256 of bytes, UTF-8 text, canonical jsonb):
 *	  fingerprint.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include "idem.h"

extern void fingerprint_bytes(const char *data, size_t len,
							  IdemFingerprint *fp);
extern void fingerprint_text(text *t, IdemFingerprint *fp);
extern void fingerprint_jsonb(Datum jsonb, IdemFingerprint *fp);
extern bytea *jsonb_body(Datum jsonb);

#endif							/* IDEM_FINGERPRINT_H */
