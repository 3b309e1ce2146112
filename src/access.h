/*-------------------------------------------------------------------------
 *
 * access.h
 *	  What record.c and outbox.c share to reach a table of idem's directly.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ACCESS_H
#define IDEM_ACCESS_H

#include "utils/rel.h"

extern Oid	access_table(const char *name, Oid schema);
extern Oid	access_index_of(const char *name, Oid schema, Oid table);
extern void access_require_heap(Relation rel);
extern void access_columns(Relation rel, const char *const *names, int n,
						   AttrNumber *attnum);

#endif							/* IDEM_ACCESS_H */
