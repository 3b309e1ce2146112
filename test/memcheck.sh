#!/usr/bin/env bash
# test/memcheck.sh: "make memcheck".  Two memory checks that are too slow
# for "make test":
#   1. the pg_regress suites with every server process under Valgrind's
#      memcheck; any error Valgrind reports fails the run;
#   2. one session calling idem_claim and idem_complete a million times:
#      the backend's memory must stay flat.
# Root runs it as the postgres user, like make test.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

PACKAGES="$PACKAGES valgrind"
ensure_packages
if is_root; then
	run_as_postgres test/memcheck.sh
	exit $?
fi

pg_dirs
ROOT=$PWD
OUT=$ROOT/tmp_check/memcheck
rm -rf "$OUT"
mkdir -p "$OUT/valgrind" "$OUT/bin"
make -s PG_CONFIG="$PG_CONFIG" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
private_install "$ROOT/tmp_install"
BIN=$ROOT/tmp_install$PG_BINDIR
status=0

# 1. a bin directory whose postgres runs under Valgrind; everything else,
# initdb included, is the real thing
for f in "$BIN"/*; do ln -s "$f" "$OUT/bin/"; done
rm "$OUT/bin/postgres"
cat >"$OUT/bin/postgres" <<WRAP
#!/bin/sh
exec valgrind --quiet --error-limit=no --leak-check=no --num-callers=30 \\
	--suppressions=$ROOT/test/valgrind.supp --gen-suppressions=all \\
	--log-file=$OUT/valgrind/%p.log "$BIN/postgres" "\$@"
WRAP
chmod +x "$OUT/bin/postgres"

say "pg_regress with every server process under Valgrind (slow)"
"$PG_PGXSDIR/src/test/regress/pg_regress" \
	--temp-instance="$OUT/regress" --temp-config=test/idem.conf \
	--bindir="$OUT/bin" --inputdir=. --outputdir="$OUT/regress_out" \
	--dbname=idem_memcheck \
	$(cd sql && ls *.sql | sed 's/\.sql$//') || status=1
errors=$(cat "$OUT"/valgrind/*.log 2>/dev/null | grep -c '^==[0-9]*== [A-Z]')
processes=$(ls "$OUT"/valgrind | wc -l)
if [ "$errors" -eq 0 ]; then
	say "Valgrind: no error in $processes server processes"
else
	say "Valgrind: $errors error lines in $processes server processes:"
	grep -l '^==[0-9]*== [A-Z]' "$OUT"/valgrind/*.log | head -3 | xargs cat
	status=1
fi

# 2. a million claims and completes in one session
say "a million claims and completes in one backend"
SOCK=$(mktemp -d /tmp/idem-sock.XXXXXX)
PORT=${IDEM_TEST_PORT:-54331}
"$BIN/initdb" -D "$OUT/data" -A trust --no-sync >/dev/null
cat test/idem.conf >>"$OUT/data/postgresql.conf"
"$BIN/pg_ctl" -D "$OUT/data" -l "$OUT/server.log" -w \
	-o "-k $SOCK -c listen_addresses= -p $PORT -c synchronous_commit=off" start >/dev/null
"$BIN/psql" -X -q -h "$SOCK" -p "$PORT" -d postgres -v ON_ERROR_STOP=1 \
	-v calls="${IDEM_MEMCHECK_CALLS:-1000000}" -f test/memory.sql || status=1
"$BIN/pg_ctl" -D "$OUT/data" -m fast -w stop >/dev/null
rm -rf "$SOCK"

[ $status -eq 0 ] && say "memcheck passed" || say "memcheck FAILED"
exit $status
