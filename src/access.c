/*-------------------------------------------------------------------------
 *
 * access.c
 *	  Looking up a table of idem's for direct access: its indexes by name,
 *	  its access method, its columns by name.
 *
 * record.c (idem_record) and outbox.c (idem_outbox) read heap tuples and
 * write through index and heap access methods; both look their table up
 * once per backend and again after a relcache invalidation, with these
 * functions, so that a table that is not what the install script made (an
 * index dropped, a column renamed, another access method) is refused with
 * a message naming what is missing rather than read wrongly.  Columns are
 * found by name, not by position, so a dropped column or a column added by
 * an upgrade script does not move them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "commands/defrem.h"
#include "utils/lsyscache.h"

#include "access.h"

/*
 * The OID of table name in schema (the extension's, InvalidOid when it is
 * not installed); an error if there is none
 */
Oid
access_table(const char *name, Oid schema)
{
	Oid			table = OidIsValid(schema) ?
		get_relname_relid(name, schema) : InvalidOid;

	if (!OidIsValid(table))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s\" of extension \"idem\" does not exist in this database",
						name)));
	return table;
}

/* The OID of index name of table, in schema; an error if there is none */
Oid
access_index_of(const char *name, Oid schema, Oid table)
{
	Oid			index = get_relname_relid(name, schema);

	if (!OidIsValid(index) || IndexGetRelation(index, true) != table)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("index \"%s\" of extension \"idem\" does not exist in this database",
						name)));
	return index;
}

/* Direct access reads heap tuples: refuse a table of another access method */
void
access_require_heap(Relation rel)
{
	if (rel->rd_rel->relam != HEAP_TABLE_AM_OID)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" must use the heap access method",
						RelationGetRelationName(rel)),
				 errdetail("It uses access method \"%s\".",
						   get_am_name(rel->rd_rel->relam))));
}

/* The attribute numbers of the n columns names of rel; an error for one missing */
void
access_columns(Relation rel, const char *const *names, int n,
			   AttrNumber *attnum)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int c = 0; c < n; c++)
	{
		attnum[c] = InvalidAttrNumber;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped &&
				strcmp(NameStr(att->attname), names[c]) == 0)
				attnum[c] = att->attnum;
		}
		if (attnum[c] == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of table \"%s\" does not exist",
							names[c], RelationGetRelationName(rel))));
	}
}
