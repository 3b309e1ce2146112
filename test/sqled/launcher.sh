#!/bin/bash
# test/sqled/launcher.sh: pg_regress's and pg_isolation_regress's
# --launcher for the suites against the SQL edition (test/run.sh, suites
# sql-regress and sql-isolation).  Before the test's own client runs, it
# registers idem with pg_tle in the test's database (sql-edition/
# idem_tle.sql, named by IDEM_TLE_SQL, with the psql of IDEM_TLE_BIN),
# once; a spec (isolationtester) also
# gets the extension created, as --load-extension=idem does for the C
# edition.  psql runs with SHOW_CONTEXT=never: PL/pgSQL names its own
# frames in an error's CONTEXT, and the expected files the suites compare
# with have the C edition's CONTEXT lines taken out (test/run.sh).
set -u
client=$1
db=
prev=
for a in "$@"; do
	case $prev in -d) db=$a ;; esac
	case $a in dbname=*) db=${a#dbname=} ;; esac
	prev=$a
done
sql() { "$IDEM_TLE_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$db" "$@" </dev/null; }
registered=$(sql -c "SELECT count(*) FROM pgtle.available_extensions() WHERE name = 'idem'") ||
	exit 1
case $registered in
0) sql -f "$IDEM_TLE_SQL" >/dev/null || exit 1 ;;
1) ;;
*)
	echo "launcher.sh: idem registered $registered times in $db" >&2
	exit 1
	;;
esac
case $(basename "$client") in
psql) exec "$@" -v SHOW_CONTEXT=never ;;
*)
	sql -c 'SET client_min_messages = warning' -c 'CREATE EXTENSION IF NOT EXISTS idem' ||
		exit 1
	exec "$@"
	;;
esac
