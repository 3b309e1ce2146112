/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL majors idem supports (15-19),
 *	  in one place.
 *
 * Code elsewhere is written against the newest major's names; this header
 * supplies them on the older ones.  It is included by idem.h, so every
 * room sees it, and nothing outside it tests PG_VERSION_NUM.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "idem needs PostgreSQL 15 or later"
#endif

/* 16 moved the varlena access macros (VARDATA_ANY, ...) to varatt.h */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * 18 replaced the pg_attribute_noreturn() suffix with a pg_noreturn prefix.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

#endif							/* IDEM_COMPAT_H */
