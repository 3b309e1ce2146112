#!/bin/bash
# test/bench/profile.sh: where a pgbench script's server time goes
# (doc/performance.md, "What remains of issue 33, profiled").
#
#   PGHOST=... PGPORT=... PGUSER=... PGDATABASE=... \
#     bash test/bench/profile.sh SCRIPT CLIENTS [SECONDS] [SYMBOL ...]
#
# Runs SCRIPT (a pgbench script, such as those `make bench` leaves in
# tmp_check/bench/scripts; :nrec is NREC, 1000 by default) with pgbench -M
# prepared and CLIENTS clients, records every CPU with `perf record -g` for
# SECONDS seconds (5 by default) in the middle of the run, and prints the
# run's tps and, for each SYMBOL, the samples of the server's backends
# under it (its callees included) as a share of those under PostgresMain:
# the share of a backend's time that the function takes.  Without SYMBOLs
# it prints the functions that take 1% or more.  Needs perf and root.
set -euo pipefail

script=${1:?usage: profile.sh SCRIPT CLIENTS [SECONDS] [SYMBOL ...]}
clients=${2:?usage: profile.sh SCRIPT CLIENTS [SECONDS] [SYMBOL ...]}
secs=${3:-5}
shift $(($# < 3 ? $# : 3))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pgbench -n -M prepared -c "$clients" -j 2 -T $((secs + 4)) \
	-D nrec="${NREC:-1000}" -f "$script" >"$work/pgbench.log" 2>&1 &
bench=$!
sleep 2
perf record -q -o "$work/perf.data" -a -g -- sleep "$secs" >/dev/null 2>&1
wait "$bench" || { cat "$work/pgbench.log" >&2; exit 1; }
grep -q 'number of failed transactions: 0 ' "$work/pgbench.log" ||
	{ cat "$work/pgbench.log" >&2; exit 1; }
sed -n 's/^tps = \([0-9.]*\) .*/tps \1/p' "$work/pgbench.log"

perf report -i "$work/perf.data" --children --sort symbol --comm postgres \
	-g none 2>/dev/null |
	awk -v want="$*" '
	BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) keep[w[i]] = i }
	/^ *[0-9.]+%/ {
		share = $1; sub(/%/, "", share)
		sym = $4
		if (sym == "PostgresMain" && base == 0) base = share
		if (!(sym in seen)) { seen[sym] = share; order[++m] = sym }
	}
	END {
		if (base == 0) { print "no samples under PostgresMain" > "/dev/stderr"; exit 1 }
		for (i = 1; i <= m; i++) {
			s = order[i]
			if ((n > 0 && (s in keep)) || (n == 0 && seen[s] / base >= 0.01))
				printf "%-40s %5.1f%%\n", s, 100 * seen[s] / base
		}
	}'
