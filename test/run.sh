#!/usr/bin/env bash
# test/run.sh: every test suite of idem, each against a temporary server
# (this is "make test").
#
# As root it installs missing Debian packages, then runs itself again as
# the postgres user in a copy of the tree, because PostgreSQL refuses to run
# as root.  As any other user it builds idem, installs it into a private
# copy of the PostgreSQL installation (tmp_install/), and runs:
#   pg_regress   sql/*.sql against expected/*.out
#   isolation    test/isolation/specs/*.spec against test/isolation/expected
#   sql-regress  sql/*.sql against the SQL edition through pg_tle
#                (sql-edition/README.md, "Testing"); sql-isolation, the
#                specs against it (but one, which it names as skipped)
#   pgTAP        test/pgtap/*.sql through pg_prove
#   HTTP         test/http/e2e.test.js, the example service (Node.js)
#   clients      the client packages: clients/node (node --test) and
#                clients/python (pytest, Debian's python3), their artefacts
#                (npm pack, a wheel) installed into clean directories
#   sql-clients  HTTP and clients against the SQL edition through pg_tle
#   TAP          test/t/*.pl (PostgreSQL::Test::Cluster)
#   Citus        test/citus/*.pl, a coordinator and two workers; Citus is
#                built once by test/citus/build.sh (as root, which make
#                test does), else the suite says it skipped, unless
#                IDEM_TEST_REQUIRE_CITUS=1 (CI), which makes that a failure
#                on every major that a vendored Citus supports
# It ends with one line "idem: N passed, N failed, N skipped", followed by
# every suite, script or test skipped, how many and why (and, for Citus,
# how to provide it), e.g.
#   idem: 23 passed, 0 failed, 4 skipped (081_doc_snippets: 2 skipped,
#   needs Citus (test/citus/041_citus.pl runs these steps), at
#   doc/citus.md:24, doc/citus.md:57; citus: 2 skipped, no Citus source:
#   provide a Citus source tarball (citus-*.tar.gz) in ../shared/vendor or
#   named by IDEM_TEST_CITUS_TARBALL=FILE, then run make test as root,
#   which builds it)
# and exits non-zero if anything failed.  A skipped suite counts one per
# script; a test that skips itself, or a script that skips all, counts one.
#
# While working on one thing, run part of it (the full run is the default):
#   IDEM_TEST_SUITES="regress isolation"    which suites, of: version
#                                           regress isolation sql-regress
#                                           sql-isolation pgtap http
#                                           clients sql-clients tap citus
#   IDEM_TEST_EXCEPT="sql-isolation"        which suites not (test-matrix
#                                           runs the SQL edition's isolation
#                                           and clients on 15 only)
#   IDEM_TEST_REGRESS="claim errors"        which sql/*.sql files
#   IDEM_TEST_ISOLATION="claim-race"        which specs
#   IDEM_TEST_TAP="001_worker"              which test/t/*.pl scripts
#   IDEM_TEST_CITUS="041_citus"             which test/citus/*.pl scripts
#   IDEM_TEST_CITUS_CACHE=DIR               where Citus is built (default
#                                           /var/tmp/idem-citus/<major>)
#   IDEM_TEST_CITUS_TARBALL=FILE            its source (default
#                                           ../shared/vendor/citus-*.tar.gz)
#   IDEM_TEST_PORT=54329                    the pgTAP/HTTP server's port
#                                           (sql-clients': the next one)
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

SUITES=${IDEM_TEST_SUITES:-version regress isolation sql-regress sql-isolation pgtap http clients sql-clients tap citus}
for s in ${IDEM_TEST_EXCEPT:-}; do
	SUITES=$(echo " $SUITES " | sed "s/ $s / /")
done
[ -z "${IDEM_TEST_EXCEPT:-}" ] ||
	say "not run here: $IDEM_TEST_EXCEPT (IDEM_TEST_EXCEPT)"
want() { [[ " $SUITES " == *" $1 "* ]]; }
# how long each part took, printed before the last line ("idem: times: ...")
times=
lap_at=$SECONDS
lap() {
	times+="${times:+, }$1 $((SECONDS - lap_at)) s"
	lap_at=$SECONDS
}

ensure_packages
if is_root; then
	# Citus: a test dependency built from source, once (test/citus/build.sh);
	# if it cannot be built, the citus suite below says so
	if want citus; then
		# the copy that runs as postgres has no ../shared: it is told why
		# there is no Citus to test
		if ! citus_locate; then
			export IDEM_TEST_CITUS_SKIP="$CITUS_SKIP"
		elif ! bash test/citus/build.sh; then
			export IDEM_TEST_CITUS_SKIP="building $(basename "$CITUS_TARBALL") failed"
		fi
	fi
	# pg_tle, for the SQL edition's tests through it (test/tle/build.sh)
	if want tap || want sql-regress || want sql-isolation || want sql-clients; then
		bash test/tle/build.sh
		case $? in
			0) ;;
			2) export IDEM_TEST_TLE_SKIP="no pg_tle source" ;;
			*) export IDEM_TEST_TLE_SKIP="building pg_tle failed" ;;
		esac
	fi
	run_as_postgres test/run.sh
	exit $?
fi

pg_dirs
ROOT=$PWD
OUT=$ROOT/tmp_check
rm -rf "$OUT"
mkdir -p "$OUT"

say "building with $PG_CONFIG"
PG_CFLAGS="${IDEM_CFLAGS:-}" make -s PG_CONFIG="$PG_CONFIG" >"$OUT/build.log" 2>&1 ||
	{ cat "$OUT/build.log"; say "build failed"; exit 1; }
grep -E 'warning:' "$OUT/build.log" || true
private_install "$ROOT/tmp_install"
lap build
BIN=$ROOT/tmp_install$PG_BINDIR
export PATH=$BIN:$PATH

passed=0
failed=0
skipped=0
skips=()

# skip N SUITE REASON: N tests of SUITE not run, and why
skip() {
	skipped=$((skipped + $1))
	skips+=("$2: $1 skipped, $3")
	say "$2: skipped ($3)"
}

# prove_skips LOG: what a prove (-v) or pg_prove log skipped, one line
# "SCRIPT: N skipped, REASON" per script and reason: the tests that skip
# themselves (ok N # skip REASON) and the scripts that skip all (SCRIPT ..
# skipped: REASON, or 1..0 # SKIP REASON).  Skips whose reasons differ only
# by a leading "PATH:LINE, " are one line, "SCRIPT: N skipped, REASON, at
# PATH:LINE, PATH:LINE".
prove_skips() {
	perl -ne '
		# a reason may start with where: "PATH:LINE, REASON"
		sub add { my ($s, $r) = @_; $r = "no reason given" if $r eq "";
			my $at = $r =~ s/^(\S+:\d+), // ? $1 : undef;
			push @order, "$s\0$r" unless $n{"$s\0$r"}++;
			push @{$at{"$s\0$r"}}, $at if defined $at }
		if (/^(\S+?)(?:\.pl|\.sql|\.t)? \.{2,}(?: (.*))?$/) {
			my $rest = $2 // "";
			($script = $1) =~ s{.*/}{};
			if ($rest =~ /^skipped:\s*(.*?)\s*$/) { add($script, $1); $whole{$script} = 1 }
		} elsif (/^\s*ok \d+(?: [^#]*)? # skip\s*(.*?)\s*$/i) {
			add($script // "?", $1);
		} elsif (/^\s*1\.\.0 # skip\s*(.*?)\s*$/i && !$whole{$script // "?"}) {
			add($script // "?", $1); $whole{$script // "?"} = 1;
		}
		END { for (@order) { my ($s, $r) = split /\0/;
			my $at = $at{$_} ? ", at " . join(", ", @{$at{$_}}) : "";
			print "$s: $n{$_} skipped, $r$at\n" } }
	' "$1"
}

# the version lives in idem.control; META.json and the install script
# must follow it
if want version; then
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control)
if perl -MJSON::PP -e '
	my $m = decode_json(do { local $/; <STDIN> });
	exit !($m->{version} eq $ARGV[0] && $m->{provides}{idem}{version} eq $ARGV[0]);
	' "$version" <META.json && [ -f "idem--$version.sql" ]; then
	say "version $version: idem.control, META.json and idem--$version.sql agree"
	passed=$((passed + 1))
else
	say "version $version of idem.control is not the version of META.json or of an install script"
	failed=$((failed + 1))
fi
fi

# the library exports only what the server looks up by name: the magic
# block, _PG_init, the SQL functions of the install scripts with their
# info records, and the background workers' idem_ functions
if want version; then
	entry=$(sed -n "s/.*'MODULE_PATHNAME', *'\([a-z_0-9]*\)'.*/\1/p" idem--*.sql | sort -u)
	loose=$(nm -D --defined-only idem.so | awk '$2 ~ /[TDBRV]/ {print $3}' |
		grep -vE '^(Pg_magic_func|_PG_init|idem_[a-z_]*_main|_init|_fini|_edata|_end|__bss_start)$' |
		sed 's/^pg_finfo_//' | grep -vxF "$entry" | sort -u)
	if [ -z "$loose" ]; then
		say "exports: idem.so exports its entry points only"
		passed=$((passed + 1))
	else
		say "exports: idem.so exports names that are no entry point: $(echo $loose)"
		failed=$((failed + 1))
	fi
fi

# the rooms of src/ include each other one way (test/include_graph.py)
if want version; then
	if graph=$(python3 test/include_graph.py src); then
		say "includes: no circle among the rooms of src/"
		passed=$((passed + 1))
	else
		echo "$graph" | grep '^circle:'
		say "includes: the rooms of src/ include each other in a circle"
		failed=$((failed + 1))
	fi
fi
want version && lap version

# count_regress LOG: add a pg_regress run's result to the totals
count_regress() {
	local log=$1 n
	if n=$(grep -oE 'All [0-9]+ tests passed' "$log" | grep -oE '[0-9]+'); then
		passed=$((passed + n))
	elif grep -qE '[0-9]+ of [0-9]+ tests (failed|passed)' "$log"; then
		local f t
		f=$(grep -oE '[0-9]+ of [0-9]+ tests failed' "$log" | awk '{print $1}')
		t=$(grep -oE '[0-9]+ of [0-9]+ tests failed' "$log" | awk '{print $3}')
		failed=$((failed + ${f:-0}))
		passed=$((passed + ${t:-0} - ${f:-0}))
	else
		failed=$((failed + 1))
	fi
}

# count_prove LOG: add a prove or pg_prove run's result to the totals.  A
# script that failed tests counts each; one that died (a bad exit status or
# a missing plan) without a failed test counts as one failure.
count_prove() {
	local log=$1 t f
	t=$(grep -oE 'Tests=[0-9]+' "$log" | grep -oE '[0-9]+')
	if [ -z "$t" ]; then
		failed=$((failed + 1))
		return
	fi
	# tests that skip themselves (ok N # skip) ran nothing: they count as
	# skipped, not passed; so does a script that skips all (1..0 # SKIP,
	# which prove shows as "SCRIPT .. skipped: REASON").  Each is named in
	# the summary line, with its reason.
	local s l
	s=$(grep -ciE '^ *ok [0-9]+( [^#]*)? # skip' "$log")
	t=$((t - s))
	while IFS= read -r l; do
		skips+=("$l")
		skipped=$((skipped + $(echo "$l" | sed 's/^[^:]*: \([0-9]*\) skipped.*/\1/')))
	done < <(prove_skips "$log")
	f=$(sed -n 's/.*Tests: [0-9]* Failed: \([0-9]*\)).*/\1/p' "$log" |
		awk '{ s += ($1 > 0 ? $1 : 1) } END { print s + 0 }')
	if ! grep -q '^Result: PASS' "$log" && [ "$f" -eq 0 ]; then
		f=1
	fi
	failed=$((failed + f))
	passed=$((passed + t - f))
	[ $passed -ge 0 ] || passed=0
}

# pick NAMES LIST...: the names of LIST that the space-separated NAMES
# selects (all of LIST when NAMES is empty)
pick() {
	local names=$1 n
	shift
	for n in "$@"; do
		[ -z "$names" ] || [[ " $names " == *" $n "* ]] && echo "$n"
	done
}

# pg_regress: one file per concern in sql/
if want regress; then
	say "pg_regress"
	"$PG_PGXSDIR/src/test/regress/pg_regress" \
		--temp-instance="$OUT/regress" --temp-config=test/idem.conf \
		--bindir="$BIN" --inputdir=. --outputdir="$OUT/regress_out" \
		--dbname=idem_regress \
		$(pick "${IDEM_TEST_REGRESS:-}" $(cd sql && ls *.sql | sed 's/\.sql$//')) 2>&1 |
		tee "$OUT/regress.log"
	count_regress "$OUT/regress.log"
	[ -f "$OUT/regress_out/regression.diffs" ] && cat "$OUT/regress_out/regression.diffs"
fi
want regress && lap regress

# isolation: concurrent sessions
if want isolation; then
	say "isolation"
	"$PG_PGXSDIR/src/test/isolation/pg_isolation_regress" \
		--temp-instance="$OUT/isolation" --temp-config=test/idem.conf \
		--bindir="$BIN" --inputdir=test/isolation \
		--outputdir="$OUT/isolation_out" --load-extension=idem \
		--dbname=idem_isolation \
		$(pick "${IDEM_TEST_ISOLATION:-}" $(cd test/isolation/specs && ls *.spec | sed 's/\.spec$//')) 2>&1 |
		tee "$OUT/isolation.log"
	count_regress "$OUT/isolation.log"
	[ -f "$OUT/isolation_out/regression.diffs" ] && cat "$OUT/isolation_out/regression.diffs"
fi
want isolation && lap isolation

# tle_install: a copy of the server's installation with pg_tle and without
# idem's library or control file, a managed service, in tmp_install_tle
# (IDEM_TEST_TLE_INSTALL names its prefix); false when pg_tle is not built
tle_install() {
	[ -z "${IDEM_TEST_TLE_SKIP:-}" ] && [ -f "$TLE_CACHE/stamp" ] || return 1
	[ -n "${IDEM_TEST_TLE_INSTALL:-}" ] && return 0
	local tle=$ROOT/tmp_install_tle
	rm -rf "$tle"
	mkdir -p "$tle$PG_BINDIR" "$tle$PG_PKGLIBDIR" "$tle$PG_SHAREDIR"
	cp -a "$PG_BINDIR/." "$tle$PG_BINDIR/"
	cp -a "$PG_PKGLIBDIR/." "$tle$PG_PKGLIBDIR/"
	cp -a "$PG_SHAREDIR/." "$tle$PG_SHAREDIR/"
	rm -f "$tle$PG_PKGLIBDIR"/idem.so "$tle$PG_SHAREDIR"/extension/idem.control \
		"$tle$PG_SHAREDIR"/extension/idem--*.sql
	cp -a "$TLE_CACHE/root/." "$tle/"
	export IDEM_TEST_TLE_INSTALL=$tle$(dirname "$PG_BINDIR")
}

# sql_edition_suite NAME DRIVER INPUTS TESTS...: run the C edition's
# pg_regress (DRIVER pg_regress, INPUTS sql) or isolation (DRIVER
# pg_isolation_regress, INPUTS specs) files against the SQL edition,
# installed through pg_tle on a server without idem's library
# (test/sqled/launcher.sh).  They are compared with the C edition's
# expected files without their CONTEXT lines (PL/pgSQL adds frames of its
# own), or with sql-edition/expected/NAME/TEST.out where README's table of
# differences says why the SQL edition answers otherwise.
sql_edition_suite() {
	local name=$1 driver=$2 inputs=$3 source
	shift 3
	case $inputs in sql) source=. ;; *) source=test/isolation ;; esac
	local in=$OUT/${name}_in
	rm -rf "$in"
	mkdir -p "$in/expected"
	cp -a "$source/$inputs" "$in/"
	for f in "$source"/expected/*.out; do
		perl -ne '
			if (/^CONTEXT:  /) { $ctx = 1; next }
			if ($ctx && /^(PL\/pgSQL function |SQL statement "|SQL function ")/) { next }
			$ctx = 0; print' "$f" >"$in/expected/$(basename "$f")"
	done
	[ -d "sql-edition/expected/$name" ] && cp sql-edition/expected/"$name"/*.out "$in/expected/"
	IDEM_TLE_SQL=$ROOT/sql-edition/idem_tle.sql IDEM_TLE_BIN=$IDEM_TEST_TLE_INSTALL/bin \
		"$PG_PGXSDIR/src/test/$([ "$driver" = pg_regress ] && echo regress || echo isolation)/$driver" \
		--temp-instance="$OUT/$name" --temp-config=test/sqled/tle.conf \
		--bindir="$IDEM_TEST_TLE_INSTALL/bin" --inputdir="$in" \
		--outputdir="$OUT/${name}_out" --load-extension=pg_tle \
		--launcher="$ROOT/test/sqled/launcher.sh" --dbname=idem_$name "$@" 2>&1 |
		tee "$OUT/$name.log"
	count_regress "$OUT/$name.log"
	[ -f "$OUT/${name}_out/regression.diffs" ] && cat "$OUT/${name}_out/regression.diffs"
}

# node_suite DB DIR FILES...: node --test FILES in DIR (its packages
# installed by npm ci, once per run) against database DB, made here, of the
# server that PGHOST and PGPORT name; node's TAP reporter ends with
# "# pass N" and "# fail N" whatever Node's version
node_suite() {
	local db=$1 dir=$2 stamp t f
	shift 2
	stamp=$OUT/npm-$(echo "$dir" | tr / -)
	createdb "$db"
	if [ ! -f "$stamp" ] && ! (cd "$dir" && npm ci --no-audit --no-fund) >"$stamp.log" 2>&1; then
		cat "$stamp.log"
		say "npm ci failed in $dir"
		failed=$((failed + 1))
		return
	fi
	touch "$stamp"
	(cd "$dir" && PGDATABASE=$db node --test --test-reporter=tap "$@") 2>&1 |
		tee "$OUT/$db.log"
	t=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$OUT/$db.log")
	f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$OUT/$db.log")
	passed=$((passed + ${t:-0}))
	failed=$((failed + ${f:-1}))
}

# http_suite DB: the HTTP example, end to end (test/http), against database
# DB of the server that PGHOST and PGPORT name
http_suite() {
	say "HTTP end to end (test/http, Node.js)${2:+, $2}"
	node_suite "$1" test/http $(cd test/http && ls *.test.js)
}

# clients_suite PREFIX [NODE_FILE_LEFT_OUT [LABEL]]: the client packages
# (clients/) against databases PREFIX_node and PREFIX_python of the server
# that PGHOST and PGPORT name: clients/node's test files (all, or all but
# one), and clients/python's pytest, with Debian's python3, whose last line
# is "N passed, N failed, N errors, N skipped" (any order, each part
# optional)
clients_suite() {
	local db=$1_python sumline
	say "client packages: clients/node (Node.js)${3:+, $3}"
	if [ -n "${2:-}" ] && [ ! -f "clients/node/test/$2" ]; then
		say "clients_suite: no clients/node/test/$2 to leave out"
		failed=$((failed + 1))
		return
	fi
	node_suite "$1_node" clients/node $(cd clients/node && ls test/*.test.js | grep -vxF "test/${2:-}")
	say "client packages: clients/python (pytest)${3:+, $3}"
	createdb "$db"
	PGDATABASE=$db PYTHONPATH=$ROOT/clients/python/src \
		PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -p no:cacheprovider -v \
		clients/python/tests 2>&1 | tee "$OUT/$db.log"
	sumline=$(grep -E '^=+ .*(passed|failed|error|skipped).* in [0-9.]+s' "$OUT/$db.log" | tail -1)
	n() { echo "$sumline" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
	if [ -z "$sumline" ]; then
		say "clients/python: no pytest summary line"
		failed=$((failed + 1))
		return
	fi
	passed=$((passed + $(n passed)))
	failed=$((failed + $(n failed) + $(n 'errors?')))
	skipped=$((skipped + $(n skipped)))
	# pytest -v names each skipped test: "PATH::TEST SKIPPED (REASON)"
	[ "$(n skipped)" -eq 0 ] ||
		skips+=("clients/python: $(n skipped) skipped by pytest, $(
			sed -n 's/^\([^ ]*::[^ ]*\) SKIPPED *\(.*[^ ]\) *\[ *[0-9]*%\]$/\1 \2/p; s/^\([^ ]*::[^ ]*\) SKIPPED *\[ *[0-9]*%\]$/\1/p' \
				"$OUT/$db.log" | sed 's/^.*:://' | paste -sd, - | sed 's/,/, /g')")
}

# the same suites against the SQL edition (sql-edition/), through pg_tle
if want sql-regress || want sql-isolation; then
	if ! tle_install; then
		want sql-regress && skip 1 sql-regress "${IDEM_TEST_TLE_SKIP:-pg_tle not built: run make test as root}"
		want sql-isolation && skip 1 sql-isolation "${IDEM_TEST_TLE_SKIP:-pg_tle not built: run make test as root}"
	elif ! python3 sql-edition/generate.py >"$OUT/sql-edition.log" 2>&1; then
		cat "$OUT/sql-edition.log"
		say "sql-edition/generate.py failed"
		failed=$((failed + 1))
	else
		if want sql-regress; then
			say "pg_regress against the SQL edition"
			sql_edition_suite sql-regress pg_regress sql \
				$(pick "${IDEM_TEST_REGRESS:-}" $(cd sql && ls *.sql | sed 's/\.sql$//'))
			lap sql-regress
		fi
		if want sql-isolation; then
			say "isolation against the SQL edition"
			specs=$(pick "${IDEM_TEST_ISOLATION:-}" $(cd test/isolation/specs && ls *.spec | sed 's/\.spec$//'))
			sql_edition_suite sql-isolation pg_isolation_regress specs $specs
			lap sql-isolation
		fi
	fi
fi


# pgTAP (the schema and privileges), the HTTP example and the client
# packages, against a server of our own (a database each)
if want pgtap || want http || want clients; then
	PGDATA_TAP=$OUT/pgtap_data
	SOCK=$(mktemp -d /tmp/idem-sock.XXXXXX)
	PORT=${IDEM_TEST_PORT:-54329}
	initdb -D "$PGDATA_TAP" -A trust --no-sync >"$OUT/pgtap_initdb.log" 2>&1
	cat test/idem.conf >>"$PGDATA_TAP/postgresql.conf"
	if pg_ctl -D "$PGDATA_TAP" -l "$OUT/pgtap_server.log" -w \
		-o "-k $SOCK -c listen_addresses= -p $PORT" start >/dev/null; then
		if want pgtap; then
			say "pgTAP"
			createdb -h "$SOCK" -p "$PORT" idem_pgtap
			psql -X -q -h "$SOCK" -p "$PORT" -d idem_pgtap -v ON_ERROR_STOP=1 \
				-c 'CREATE EXTENSION pgtap' -c 'CREATE EXTENSION idem'
			pg_prove -h "$SOCK" -p "$PORT" -d idem_pgtap test/pgtap/*.sql 2>&1 |
				tee "$OUT/pgtap.log"
			count_prove "$OUT/pgtap.log"
		fi

		want http && PGHOST=$SOCK PGPORT=$PORT http_suite idem_http
		want clients && PGHOST=$SOCK PGPORT=$PORT clients_suite idem_clients
		pg_ctl -D "$PGDATA_TAP" -m fast -w stop >/dev/null
	else
		cat "$OUT/pgtap_server.log"
		failed=$((failed + 1))
	fi
	rm -rf "$SOCK"
fi
{ want pgtap || want http || want clients; } && lap pgtap+http+clients

# the HTTP example and the client packages against the SQL edition, once:
# a server of the installation with pg_tle and without idem's library
# (tle_install), idem registered with pg_tle in template1, so that every
# database made for a test, or by one, has it; clients/node's
# test/pack.test.js, which tests the package's tarball and not a database,
# runs against the C edition only
if want sql-clients; then
	if ! tle_install; then
		skip 1 sql-clients "${IDEM_TEST_TLE_SKIP:-pg_tle not built: run make test as root}"
	elif ! python3 sql-edition/generate.py >"$OUT/sql-edition.log" 2>&1; then
		cat "$OUT/sql-edition.log"
		say "sql-edition/generate.py failed"
		failed=$((failed + 1))
	else
		TLE_BIN=$IDEM_TEST_TLE_INSTALL/bin
		PGDATA_TLE=$OUT/sql_clients_data
		SOCK=$(mktemp -d /tmp/idem-sock.XXXXXX)
		PORT=$((${IDEM_TEST_PORT:-54329} + 1))
		if "$TLE_BIN/initdb" -D "$PGDATA_TLE" -A trust --no-sync >"$OUT/sql_clients_initdb.log" 2>&1 &&
			cat test/sqled/tle.conf >>"$PGDATA_TLE/postgresql.conf" &&
			"$TLE_BIN/pg_ctl" -D "$PGDATA_TLE" -l "$OUT/sql_clients_server.log" -w \
			-o "-k $SOCK -c listen_addresses= -p $PORT" start >/dev/null &&
			"$TLE_BIN/psql" -X -q -h "$SOCK" -p "$PORT" -d template1 -v ON_ERROR_STOP=1 \
				-c 'CREATE EXTENSION pg_tle' -f sql-edition/idem_tle.sql >"$OUT/sql_clients_register.log" 2>&1; then
			PGHOST=$SOCK PGPORT=$PORT http_suite idem_sql_http "the SQL edition"
			PGHOST=$SOCK PGPORT=$PORT clients_suite idem_sql_clients pack.test.js "the SQL edition"
		else
			cat "$OUT/sql_clients_initdb.log" "$OUT/sql_clients_server.log" \
				"$OUT/sql_clients_register.log" 2>/dev/null
			say "sql-clients: no server with the SQL edition"
			failed=$((failed + 1))
		fi
		"$TLE_BIN/pg_ctl" -D "$PGDATA_TLE" -m fast -w stop >/dev/null 2>&1
		rm -rf "$SOCK"
	fi
fi
want sql-clients && lap sql-clients

# TAP: the worker, restarts, reloads, a standby (PostgreSQL::Test::Cluster)
if want tap; then
	say "TAP"
	tle_install || true
	mkdir -p "$OUT/tap"
	tap_start=$(date +%s)
	PG_TEST_TIMEOUT_DEFAULT=90 TESTDIR="$OUT/tap" PG_REGRESS="$PG_PGXSDIR/src/test/regress/pg_regress" \
		prove -v -I "$PG_PGXSDIR/src/test/perl" \
		$(pick "${IDEM_TEST_TAP:-}" $(cd test/t && ls *.pl | sed 's/\.pl$//') | sed 's|^|test/t/|; s|$|.pl|') 2>&1 |
		tee "$OUT/tap.log"
	count_prove "$OUT/tap.log"
	# the slowest scripts, from when each one's log was last written (they
	# run one after another, from the suite's start)
	slow=$(cd "$OUT/tap/tmp_check/log" 2>/dev/null &&
		for f in regress_log_*; do [ -f "$f" ] && echo "$(stat -c %Y "$f") ${f#regress_log_}"; done |
		sort -n | awk -v t="$tap_start" '{print $1 - t, $2; t = $1}' | sort -rn | head -n 5 |
		awk '{printf "%s%s %s s", (NR > 1 ? ", " : ""), $2, $1}')
	[ -z "$slow" ] || say "tap: slowest: $slow"
fi
want tap && lap tap

# Citus: idem distributed over a coordinator and two workers
# (test/citus/*.pl), with the Citus that test/citus/build.sh built
if want citus; then
	say "Citus"
	if [ -f "$CITUS_CACHE/stamp" ] &&
		[[ "$(cat "$CITUS_CACHE/stamp")" == *" $($PG_CONFIG --version)" ]]; then
		say "citus: $(cat "$CITUS_CACHE/stamp"), from $CITUS_CACHE"
		cp -a "$CITUS_CACHE/root/." "$ROOT/tmp_install/"
		mkdir -p "$OUT/citus"
		PG_TEST_TIMEOUT_DEFAULT=120 TESTDIR="$OUT/citus" PG_REGRESS="$PG_PGXSDIR/src/test/regress/pg_regress" \
			prove -v -I "$PG_PGXSDIR/src/test/perl" -I test/citus \
			$(pick "${IDEM_TEST_CITUS:-}" $(cd test/citus && ls *.pl | sed 's/\.pl$//') | sed 's|^|test/citus/|; s|$|.pl|') 2>&1 |
			tee "$OUT/citus.log"
		count_prove "$OUT/citus.log"
	else
		ncitus=$(ls test/citus/*.pl | wc -l)
		reason=${IDEM_TEST_CITUS_SKIP:-}
		[ -n "$reason" ] || citus_locate || reason=$CITUS_SKIP
		# how to provide Citus, for the summary line
		provide="a Citus source tarball (citus-*.tar.gz) in ../shared/vendor or named by IDEM_TEST_CITUS_TARBALL=FILE"
		case $reason in
		"no Citus source") how="provide $provide, then run make test as root, which builds it" ;;
		"no Citus release here supports"*) how="provide a release whose configure accepts PostgreSQL $PG_MAJOR, as $provide" ;;
		building*) how="see test/citus/build.sh's output above (sudo bash test/citus/build.sh builds it again)" ;;
		*) how= ;;
		esac
		if [[ $reason == "no Citus release here supports"* ]]; then
			skip "$ncitus" citus "$reason: $how"
		elif [ "${IDEM_TEST_REQUIRE_CITUS:-0}" = 1 ]; then
			say "citus: FAILED: Citus is not built for $($PG_CONFIG --version) in $CITUS_CACHE (${reason:-build failed}), and IDEM_TEST_REQUIRE_CITUS=1"
			failed=$((failed + 1))
		elif [ -n "$reason" ]; then
			skip "$ncitus" citus "$reason${how:+: $how}"
		else
			skip "$ncitus" citus "Citus not built: run make test as root, or sudo bash test/citus/build.sh"
		fi
	fi
fi
want citus && lap citus

say "times: $times"
line="idem: $passed passed, $failed failed, $skipped skipped"
# each skipped suite, script or test, how many and why
if [ ${#skips[@]} -gt 0 ]; then
	sep=
	line+=" ("
	for s in "${skips[@]}"; do
		line+="$sep$s"
		sep='; '
	done
	line+=")"
fi
echo "$line"
[ "$failed" -eq 0 ]
