#!/bin/bash
# test/bench/sql_shape.sh: replays through each shape of test/bench/sql_shape.sql
# and fresh claims with their finish through the fresh shape, beside the
# hand-written plpg_claim (and plpg_complete) and the SQL edition's
# idem_claim (and idem_complete), alternating within each round
# (doc/performance.md, "How close the edition's shape can come").  Takes a
# database that has sql-edition/idem.sql and that file installed and keys
# r1..r1000 of tenant bench, endpoint 'POST /r' finished, and pgbench's
# connection settings from the environment (PGHOST, PGPORT, PGUSER,
# PGDATABASE).  Prints per run the tps, then the medians and their ratios
# to the hand-written functions'.
set -euo pipefail
rounds=${ROUNDS:-5} seconds=${SECONDS_PER_RUN:-4} clients=${CLIENTS:-4}
replays=(plpg_claim idem_claim proto_claim proto_one proto_bare proto_plain proto_sub)
fresh=(plpg_claim:plpg_complete idem_claim:idem_complete proto_fresh:proto_complete)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for f in "${replays[@]}"; do
	printf '%s\n' '\set k random(1, 1000)' \
		"SELECT outcome, status, body FROM $f('bench', 'POST /r', 'r' || :k, '\\x01'::bytea);" \
		> "$dir/replay-$f.sql"
done
for p in "${fresh[@]}"; do
	printf '%s\n' '\set k random(1, 9000000000000000000)' 'BEGIN;' \
		"SELECT outcome FROM ${p%:*}('bench', 'POST /f', 'f' || :k, '\\x01'::bytea);" \
		"SELECT ${p#*:}('bench', 'POST /f', 'f' || :k, 201, '\\x7b7d'::bytea);" 'COMMIT;' \
		> "$dir/fresh-${p%:*}.sql"
done
runs=()
for f in "${replays[@]}"; do runs+=("replay-$f"); done
for p in "${fresh[@]}"; do runs+=("fresh-${p%:*}"); done
for ((r = 1; r <= rounds; r++)); do
	for s in "${runs[@]}"; do
		tps=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$dir/$s.sql" 2>&1 |
			sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
		echo "$s $tps" | tee -a "$dir/all"
	done
done
median() {
	awk -v s="$1" '$1 == s { print $2 }' "$dir/all" | sort -n |
		awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
echo "median of $rounds, ratio to the hand-written function:"
for s in "${runs[@]}"; do
	awk -v s="$s" -v m="$(median "$s")" -v b="$(median "${s%%-*}-plpg_claim")" \
		'BEGIN { printf "%-20s %10.0f %6.3f\n", s, m, m / b }'
done
