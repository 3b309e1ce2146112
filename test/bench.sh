#!/usr/bin/env bash
# test/bench.sh: "make bench".  Measures idem against the floor (the same
# statements written by hand, on an identical table) and against the same
# protocol written in PL/pgSQL, in one run on a private server, with
# pgbench -M prepared.  Rounds alternate idem and its baselines; each tps
# printed is the median over the rounds, and each ratio is the ratio of the
# two medians printed beside it.  Writes the table to
# tmp_check/bench/results.md and draws tmp_check/bench/bench.png with
# gnuplot.
#
# IDEM_BENCH_SECONDS (8), IDEM_BENCH_ROUNDS (5), IDEM_BENCH_CLIENTS (4)
# and IDEM_BENCH_BIG (10000000 records) size the run.  IDEM_BENCH_ONLY=batch
# runs only the batch part (idem_claim_many against single claims and the
# INSERT ... SELECT floor, and the consumer loop); IDEM_BENCH_ONLY=outbox
# only the outbox part (against pgmq and a hand-written outbox, the full
# cycle, the latency to a LISTENing dispatcher, the size over purges);
# IDEM_BENCH_ONLY=wal only the WAL and transaction ids of replays;
# IDEM_BENCH_ONLY=clients only fresh and replay against the hand-written
# SQL at 4 and at 64 clients (IDEM_BENCH_MANY), to compare how each scales;
# IDEM_BENCH_ONLY=freeze only fresh claims with and without a frozen other
# endpoint (what the freeze check costs the claims it does not stop);
# IDEM_BENCH_ONLY=sql only the SQL edition (sql-edition/idem.sql, in a
# database of its own, called by its owner, not a superuser) against the
# same protocol in hand-written PL/pgSQL and against the C edition;
# IDEM_BENCH_ONLY=scale only fresh and replay at 100,000 against
# IDEM_BENCH_BIG records loaded through the batch calls, and the worker's
# purge of IDEM_BENCH_BIG expired records beside traffic in another
# database, with autovacuum on (at idem.purge_pause's default, or at
# IDEM_BENCH_PURGE_PAUSE; IDEM_BENCH_SCALE_PURGE=no leaves the purge out,
# IDEM_BENCH_SCALE_PURGE_AUTOVACUUM=off keeps autovacuum off the purged
# table).
# The outbox part needs pgmq's source, ../shared/vendor/pgmq-1.5.1.tar.gz
# or the file IDEM_BENCH_PGMQ names.
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

case ${IDEM_BENCH_ONLY:-} in
"" | batch | outbox | wal | clients | freeze | sql | scale) ;;
*)
	say "IDEM_BENCH_ONLY=$IDEM_BENCH_ONLY: only \"batch\", \"outbox\", \"wal\", \"clients\", \"freeze\", \"sql\" and \"scale\" are known" >&2
	exit 1
	;;
esac
# an absolute path, for the copy that runs as postgres has no ../shared;
# looked for before anything is built, so that a missing one costs nothing
IDEM_BENCH_PGMQ=${IDEM_BENCH_PGMQ:-$PWD/../shared/vendor/pgmq-1.5.1.tar.gz}
[[ $IDEM_BENCH_PGMQ = /* ]] || IDEM_BENCH_PGMQ=$PWD/$IDEM_BENCH_PGMQ
export IDEM_BENCH_PGMQ
if [ -z "${IDEM_BENCH_ONLY:-}" -o "${IDEM_BENCH_ONLY:-}" = outbox ] && [ ! -r "$IDEM_BENCH_PGMQ" ]; then
	say "the outbox part needs pgmq's source: no $IDEM_BENCH_PGMQ (set IDEM_BENCH_PGMQ, or IDEM_BENCH_ONLY=batch)" >&2
	exit 1
fi

PACKAGES="$PACKAGES gnuplot-nox"
ensure_packages
if is_root; then
	IDEM_COPY_BACK=tmp_check/bench run_as_postgres test/bench.sh
	exit $?
fi

SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-8}
ROUNDS=${IDEM_BENCH_ROUNDS:-5}
CLIENTS=${IDEM_BENCH_CLIENTS:-4}
SMALL=100000
BIG=${IDEM_BENCH_BIG:-10000000}

pg_dirs
ROOT=$PWD
OUT=$ROOT/tmp_check/bench
rm -rf "$OUT"
mkdir -p "$OUT/scripts"
make -s PG_CONFIG="$PG_CONFIG" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
private_install "$ROOT/tmp_install"
# pgmq (SQL only), the outbox part's peer, into the same private install,
# before PATH names that install (whose pg_config answers its own paths);
# two makes, since the first writes the versioned script that the second's
# wildcard installs
if [ -z "${IDEM_BENCH_ONLY:-}" -o "${IDEM_BENCH_ONLY:-}" = outbox ]; then
	mkdir "$OUT/pgmq"
	tar -xzf "$IDEM_BENCH_PGMQ" -C "$OUT/pgmq" --strip-components=1
	{ make -C "$OUT/pgmq/pgmq-extension" PG_CONFIG="$PG_CONFIG" &&
		make -C "$OUT/pgmq/pgmq-extension" install DESTDIR="$ROOT/tmp_install" PG_CONFIG="$PG_CONFIG"; } \
		>"$OUT/pgmq.log" 2>&1 || { cat "$OUT/pgmq.log"; say "building pgmq failed" >&2; exit 1; }
fi
BIN=$ROOT/tmp_install$PG_BINDIR
export PATH=$BIN:$PATH

SOCK=$(mktemp -d /tmp/idem-bench.XXXXXX)
PORT=${IDEM_BENCH_PORT:-54333}
export PGHOST=$SOCK PGPORT=$PORT PGDATABASE=bench
initdb -D "$OUT/data" -A trust --no-sync >/dev/null
cat >>"$OUT/data/postgresql.conf" <<CONF
shared_preload_libraries = 'idem'
listen_addresses = ''
synchronous_commit = off
shared_buffers = '2GB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
autovacuum = off
idem.purge_interval = '1h'
max_connections = 80
CONF
pg_ctl -D "$OUT/data" -l "$OUT/server.log" -w -o "-k $SOCK -p $PORT" start >/dev/null
trap 'pg_ctl -D "$OUT/data" -m fast -w stop >/dev/null; rm -rf "$SOCK"' EXIT
createdb bench
psql -X -q -v ON_ERROR_STOP=1 -f test/bench/setup.sql >/dev/null

q() { psql -X -Atq -v ON_ERROR_STOP=1 -c "$1"; }

# a 200-byte request (fingerprinted) and a 100-byte response
FP="'\\x$(head -c 200 /dev/zero | tr '\0' 'a' | od -An -v -tx1 | tr -d ' \n')'::bytea"
BODY="'\\x$(head -c 100 /dev/zero | tr '\0' 'b' | od -An -v -tx1 | tr -d ' \n')'::bytea"

script() { cat >"$OUT/scripts/$1.sql"; }
script fresh_idem <<S
\set k random(1, 9000000000000000000)
BEGIN;
SELECT outcome FROM idem_claim('bench', 'POST /f', 'f' || :k, $FP);
SELECT idem_complete('bench', 'POST /f', 'f' || :k, 201, $BODY);
COMMIT;
S
script fresh_hand <<S
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO hand_record (tenant, endpoint, key, state, fingerprint, attempt, created_at, claimed_at, lease_expires_at, expires_at) VALUES ('bench', 'POST /f', 'f' || :k, 'pending', sha256($FP), 1, now(), now(), now() + interval '5 min', now() + interval '24 hours') ON CONFLICT (tenant, endpoint, key) DO NOTHING;
UPDATE hand_record SET state = 'succeeded', status = 201, body = $BODY, finished_at = now() WHERE tenant = 'bench' AND endpoint = 'POST /f' AND key = 'f' || :k AND state = 'pending';
COMMIT;
S
script fresh_plpgsql <<S
\set k random(1, 9000000000000000000)
BEGIN;
SELECT outcome FROM plpg_claim('bench', 'POST /f', 'f' || :k, $FP);
SELECT plpg_complete('bench', 'POST /f', 'f' || :k, 201, $BODY);
COMMIT;
S
script replay_idem <<S
\set k random(1, :nrec)
SELECT outcome, status, body FROM idem_claim('bench', 'POST /r', 'r' || :k, $FP);
S
script replay_hand <<S
\set k random(1, :nrec)
SELECT state, status, body FROM hand_record WHERE tenant = 'bench' AND endpoint = 'POST /r' AND key = 'r' || :k;
S
script replay_plpgsql <<S
\set k random(1, :nrec)
SELECT outcome, status, body FROM plpg_claim('bench', 'POST /r', 'r' || :k, $FP);
S
script contention <<S
\set k random(1, 10)
SELECT 'c' || :k || '-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint AS key \gset
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('bench', 'POST /c', :key, $FP) \gset
\if :claimed
SELECT idem_complete('bench', 'POST /c', :key, 201, $BODY);
\endif
COMMIT;
S

# pgbench NAME [CLIENTS] [SECONDS]: the run's tps; a failed run ends the bench
run() {
	local name=$1 clients=${2:-$CLIENTS} secs=${3:-$SECONDS_PER_RUN} log
	log="$OUT/$name.$(date +%s%N).log"
	if ! pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" -D nrec="$NREC" \
		-f "$OUT/scripts/$name.sql" >"$log" 2>&1 ||
		! grep -q 'number of failed transactions: 0 ' "$log"; then
		cat "$log" >&2
		say "pgbench $name failed" >&2
		exit 1
	fi
	sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log"
}

# fill TABLE N: records r1..rN in TABLE, finished, for the replay runs
fill() {
	psql -X -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO $1 (tenant, endpoint, key, state, fingerprint, status, body, attempt,
	created_at, claimed_at, lease_expires_at, finished_at, expires_at)
SELECT 'bench', 'POST /r', 'r' || i, 'succeeded', sha256($FP), 201, $BODY, 1,
	now(), now(), now(), now(), now() + interval '24 hours'
  FROM generate_series((SELECT count(*) + 1 FROM $1 WHERE endpoint = 'POST /r'), $2) i;
VACUUM ANALYZE $1;
SQL
}

# timed SQL: the statement's time in ms, as psql's \timing gives it
timed() { psql -X -At -v ON_ERROR_STOP=1 -c '\timing on' -c "$1" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'; }

# The batch part.  100,000 fresh keys (no fingerprint: a consumer dedupes
# by message id) claimed in one statement, three ways, alternating within
# each round: (a) one idem_claim per key (generate_series ... LATERAL),
# (b) one idem_claim_many, (c) INSERT ... SELECT of the same rows into
# hand_record, the physical floor, and (d) the same with ON CONFLICT DO
# NOTHING.  Then the consumer loop over the wire, 500 keys a transaction:
# a claim and a complete per key, one statement each, against one
# idem_claim_many and one idem_complete_many, with 2 clients (the cores).
BATCH_KEYS=100000
CONSUMER_KEYS=500
batch_bench() {
	local r a b c d
	say "batch: $ROUNDS rounds of $BATCH_KEYS keys in one statement"
	: >"$OUT/batch_stmt.txt"
	for r in $(seq "$ROUNDS"); do
		local qa="SELECT count(*) FROM generate_series(1, $BATCH_KEYS) g, LATERAL idem_claim('bench', 'POST /ba', 'a$r-' || g) c WHERE c.outcome = 'claimed'"
		local qb="SELECT count(*) FROM idem_claim_many('bench', 'POST /bb', (SELECT array_agg('b$r-' || g) FROM generate_series(1, $BATCH_KEYS) g)) c WHERE c.outcome = 'claimed'"
		local qc="INSERT INTO hand_record (tenant, endpoint, key, state, attempt, created_at, claimed_at, lease_expires_at, expires_at) SELECT 'bench', 'POST /bc', 'c$r-' || g, 'pending', 1, now(), now(), now() + interval '5 min', now() + interval '24 hours' FROM generate_series(1, $BATCH_KEYS) g"
		local qd="${qc//POST \/bc/POST /bd} ON CONFLICT (tenant, endpoint, key) DO NOTHING"
		if [ $((r % 2)) -eq 1 ]; then
			a=$(timed "$qa"); b=$(timed "$qb"); c=$(timed "$qc"); d=$(timed "$qd")
		else
			d=$(timed "$qd"); c=$(timed "$qc"); b=$(timed "$qb"); a=$(timed "$qa")
		fi
		echo "$a $b $c $d" | tee -a "$OUT/batch_stmt.txt"
	done
	[ "$(q "SELECT count(*) FROM idem_record WHERE endpoint IN ('POST /ba', 'POST /bb') AND state = 'pending'")" = $((2 * ROUNDS * BATCH_KEYS)) ] ||
		{ say "the batch runs did not claim every key" >&2; exit 1; }

	say "consumer loop: $CONSUMER_KEYS keys a transaction"
	{
		echo '\set base random(1, 9000000000000000)'
		echo 'BEGIN;'
		for i in $(seq "$CONSUMER_KEYS"); do
			echo "SELECT outcome FROM idem_claim('bench', 'POST /qs', 's' || :base || '-$i');"
		done
		for i in $(seq "$CONSUMER_KEYS"); do
			echo "SELECT idem_complete('bench', 'POST /qs', 's' || :base || '-$i', 201, $BODY);"
		done
		echo 'COMMIT;'
	} >"$OUT/scripts/consumer_single.sql"
	script consumer_batch <<S
\set base random(1, 9000000000000000)
BEGIN;
SELECT count(*) FROM idem_claim_many('bench', 'POST /qb', (SELECT array_agg('b' || :base || '-' || g) FROM generate_series(1, $CONSUMER_KEYS) g));
SELECT idem_complete_many('bench', 'POST /qb', (SELECT array_agg('b' || :base || '-' || g) FROM generate_series(1, $CONSUMER_KEYS) g), array_fill(201, ARRAY[$CONSUMER_KEYS]), array_fill($BODY, ARRAY[$CONSUMER_KEYS]));
COMMIT;
S
	: >"$OUT/consumer.txt"
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) -eq 1 ]; then
			a=$(run consumer_single 2); b=$(run consumer_batch 2)
		else
			b=$(run consumer_batch 2); a=$(run consumer_single 2)
		fi
		echo "$a $b" | tee -a "$OUT/consumer.txt"
	done
}

# the batch part's rows of the report
batch_rows() {
	local a b c d s m
	a=$(awk '{print $1}' "$OUT/batch_stmt.txt" | median)
	b=$(awk '{print $2}' "$OUT/batch_stmt.txt" | median)
	c=$(awk '{print $3}' "$OUT/batch_stmt.txt" | median)
	d=$(awk '{print $4}' "$OUT/batch_stmt.txt" | median)
	s=$(awk '{print $1}' "$OUT/consumer.txt" | median)
	m=$(awk '{print $2}' "$OUT/consumer.txt" | median)
	echo "| $BATCH_KEYS fresh keys in one statement, ms (median of $ROUNDS): (b) one idem_claim_many | $b | (c) INSERT ... SELECT $c | (b)/(c) $(ratio "$b" "$c") | ≤ 1.5 |"
	echo "| the same: (a) one idem_claim per key | $a | (b) idem_claim_many $b | (a)/(b) $(ratio "$a" "$b") | ≥ 1.5 |"
	echo "| the same: (d) INSERT ... SELECT ... ON CONFLICT DO NOTHING | $d | (c) INSERT ... SELECT $c | (d)/(c) $(ratio "$d" "$c") | |"
	echo "| consumer loop, $CONSUMER_KEYS keys a transaction, 2 clients, keys/s (median of $ROUNDS): idem_claim_many + idem_complete_many | $(awk -v t="$m" -v n="$CONSUMER_KEYS" 'BEGIN {printf "%.0f", t * n}') | a claim and a complete per key $(awk -v t="$s" -v n="$CONSUMER_KEYS" 'BEGIN {printf "%.0f", t * n}') | $(ratio "$m" "$s") | ≥ 5 |"
}

# The outbox part (issue 23): idem's outbox against pgmq (the peer, SQL on
# plain tables) and against the same row written by hand, with the same
# durability (the server's synchronous_commit = off).  Every enqueuing
# transaction also writes a row of a business table, orders.  The payload
# is one 100-byte JSON document: bytea for idem and by hand, jsonb for pgmq.
# (a) one enqueue in a business transaction: idem_enqueue, pgmq.send, the
# row by hand (INSERT ... ON CONFLICT DO NOTHING into hand_outbox, which
# has idem_outbox's columns and indexes), and the business INSERT alone.
# (b) the full cycle, per pgbench transaction: enqueue OB_CYCLE messages in
# one business transaction, take them (committed, as a dispatcher does
# before it calls out), then deliver each; one call per message, one
# statement for the enqueues and one for the deliveries, the same shape for
# pgmq (send, read, archive).  (b2) the batch cycle, with 2 clients: one
# idem_enqueue_many of OB_CYCLE in the business transaction, one take, one
# idem_delivered_many, against pgmq's batch calls (send_batch, read,
# archive(ids[])).  (c) the latency from
# an enqueue's commit to a LISTENing dispatcher's take (test/bench/latency.py)
# on the idle server.  Then the size of idem_outbox over 10 cycles of fill,
# take and deliver all, purge and VACUUM (standing for autovacuum), in a
# database of its own.
OB_JSON='{"to": "buyer@example.com", "order": 7, "pad": "'$(head -c 50 /dev/zero | tr '\0' x)'"}'
OB_PAYLOAD="'$OB_JSON'::bytea"
OB_JSONB="'$OB_JSON'::jsonb"
OB_CYCLE=100
OB_LATENCY=200
OB_SIZE=20000
OB_TAKE=10000	# the most one idem_take leases
outbox_bench() {
	local r i p h b ib c full after
	psql -X -q -v ON_ERROR_STOP=1 -f test/bench/outbox.sql >/dev/null
	script ob_idem <<S
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO orders (item) VALUES ('book');
SELECT outcome FROM idem_enqueue('bench', 'mail', 'k' || :k, $OB_PAYLOAD);
COMMIT;
S
	script ob_pgmq <<S
BEGIN;
INSERT INTO orders (item) VALUES ('book');
SELECT * FROM pgmq.send('bench', $OB_JSONB);
COMMIT;
S
	script ob_hand <<S
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO orders (item) VALUES ('book');
INSERT INTO hand_outbox (id, tenant, topic, key, state, payload, redeliver, max_attempts, attempt, attempt_base, not_before, created_at) VALUES (nextval('hand_outbox_id_seq'), 'bench', 'mail', 'k' || :k, 'queued', $OB_PAYLOAD, true, 10, 0, 0, now(), now()) ON CONFLICT (tenant, topic, key) DO NOTHING;
COMMIT;
S
	script ob_business <<S
BEGIN;
INSERT INTO orders (item) VALUES ('book');
COMMIT;
S
	say "outbox (a): enqueue in a business transaction, $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $CLIENTS clients"
	: >"$OUT/ob_enqueue.txt"
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) -eq 1 ]; then
			i=$(run ob_idem); p=$(run ob_pgmq); h=$(run ob_hand); b=$(run ob_business)
		else
			b=$(run ob_business); h=$(run ob_hand); p=$(run ob_pgmq); i=$(run ob_idem)
		fi
		echo "$i $p $h $b" | tee -a "$OUT/ob_enqueue.txt"
	done

	# the subqueries keep one call per row: a volatile or set-returning
	# target list is neither pulled up nor dropped by the planner
	script cycle_idem <<S
\set base random(1, 9000000000000000)
BEGIN;
INSERT INTO orders (item) VALUES ('cycle');
SELECT count(*) FROM (SELECT idem_enqueue('bench', 'cycle', :base || '-' || g, $OB_PAYLOAD) FROM generate_series(1, $OB_CYCLE) g) e;
COMMIT;
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS attempts FROM idem_take('cycle', $OB_CYCLE, '30 s') \gset
SELECT count(*) FROM (SELECT idem_delivered(i, a) FROM unnest(:ids::bigint[], :attempts::int[]) u(i, a)) d;
S
	script cycle_pgmq <<S
BEGIN;
INSERT INTO orders (item) VALUES ('cycle');
SELECT count(*) FROM (SELECT pgmq.send('cycle', $OB_JSONB) FROM generate_series(1, $OB_CYCLE) g) e;
COMMIT;
SELECT coalesce(array_agg(msg_id), '{}') AS ids FROM pgmq.read('cycle', 30, $OB_CYCLE) \gset
SELECT count(*) FROM (SELECT pgmq.archive('cycle', i) FROM unnest(:ids::bigint[]) i) d;
S
	script cycle_idem_batch <<S
\set base random(1, 9000000000000000)
BEGIN;
INSERT INTO orders (item) VALUES ('cycle');
SELECT count(*) FROM idem_enqueue_many('bench', 'cycle_batch', (SELECT array_agg(:base || '-' || g) FROM generate_series(1, $OB_CYCLE) g), array_fill($OB_PAYLOAD, ARRAY[$OB_CYCLE]));
COMMIT;
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS attempts FROM idem_take('cycle_batch', $OB_CYCLE, '30 s') \gset
SELECT idem_delivered_many(:ids::bigint[], :attempts::int[]);
S
	script cycle_pgmq_batch <<S
BEGIN;
INSERT INTO orders (item) VALUES ('cycle');
SELECT count(*) FROM pgmq.send_batch('cycle_batch', array_fill($OB_JSONB, ARRAY[$OB_CYCLE]));
COMMIT;
SELECT coalesce(array_agg(msg_id), '{}') AS ids FROM pgmq.read('cycle_batch', 30, $OB_CYCLE) \gset
SELECT count(*) FROM pgmq.archive('cycle_batch', :ids::bigint[]);
S
	# (a)'s messages are never taken: (b) starts from empty tables on both
	# sides.  A cycle leaves dead versions on both sides, so each run starts
	# from its tables vacuumed and analyzed, as autovacuum (off here) would
	# leave them.
	q "TRUNCATE orders, hand_outbox, idem_outbox, pgmq.q_bench, pgmq.a_bench" >/dev/null
	say "outbox (b): the full cycle, $OB_CYCLE messages a transaction"
	: >"$OUT/ob_cycle.txt"
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) -eq 1 ]; then
			i=$(vacuumed_run cycle_idem "$CLIENTS" idem_outbox)
			p=$(vacuumed_run cycle_pgmq "$CLIENTS" pgmq.q_cycle, pgmq.a_cycle)
			ib=$(vacuumed_run cycle_idem_batch 2 idem_outbox)
			b=$(vacuumed_run cycle_pgmq_batch 2 pgmq.q_cycle_batch, pgmq.a_cycle_batch)
		else
			b=$(vacuumed_run cycle_pgmq_batch 2 pgmq.q_cycle_batch, pgmq.a_cycle_batch)
			ib=$(vacuumed_run cycle_idem_batch 2 idem_outbox)
			p=$(vacuumed_run cycle_pgmq "$CLIENTS" pgmq.q_cycle, pgmq.a_cycle)
			i=$(vacuumed_run cycle_idem "$CLIENTS" idem_outbox)
		fi
		echo "$i $p $b $ib" | tee -a "$OUT/ob_cycle.txt"
	done
	# messages/s is taken as tps times OB_CYCLE; what is left undelivered
	# bounds its error (a take may find fewer, and a run's end may stop a
	# client between its enqueue and its take)
	OB_LEFT=$(q "SELECT (SELECT count(*) FROM idem_outbox WHERE topic = 'cycle' AND state <> 'delivered') || ', ' || (SELECT count(*) FROM pgmq.q_cycle) || ', ' || (SELECT count(*) FROM pgmq.q_cycle_batch) || ', ' || (SELECT count(*) FROM idem_outbox WHERE topic = 'cycle_batch' AND state <> 'delivered')")

	say "outbox (c): latency, $OB_LATENCY messages 20 ms apart"
	/usr/bin/python3 test/bench/latency.py "$OB_LATENCY" 0.02 >"$OUT/ob_latency.txt"

	say "outbox size: 10 cycles of $OB_SIZE messages"
	createdb obsize
	PGDATABASE=obsize q 'CREATE EXTENSION idem'
	: >"$OUT/ob_size.txt"
	for c in $(seq 10); do
		{
			# the enqueue fixes its message's retention, from which a
			# delivery sets its expiry: 2 s later, for the purge (the
			# retention must outlive the retry window: 1 s here)
			echo "SET idem.retry_window = '1s'; SET idem.outbox_retention = '2s';"
			echo "SELECT count(*) FROM (SELECT idem_enqueue('size', 'size', 'c$c-' || g, $OB_PAYLOAD) FROM generate_series(1, $OB_SIZE) g) e;"
			for r in $(seq $((OB_SIZE / OB_TAKE))); do
				echo "SELECT array_agg(id) AS ids, array_agg(attempt) AS attempts FROM idem_take('size', $OB_TAKE) \\gset"
				echo "SELECT count(*) FROM (SELECT idem_delivered(i, a) FROM unnest(:'ids'::bigint[], :'attempts'::int[]) u(i, a)) d;"
			done
		} | psql -X -q -d obsize -v ON_ERROR_STOP=1 >/dev/null
		[ "$(PGDATABASE=obsize q "SELECT count(*) FROM idem_outbox WHERE state <> 'delivered'")" = 0 ] ||
			{ say "outbox size: cycle $c did not deliver every message" >&2; exit 1; }
		full=$(PGDATABASE=obsize q "SELECT pg_total_relation_size('idem_outbox')")
		psql -X -q -d obsize -v ON_ERROR_STOP=1 -c 'SELECT pg_sleep(2.1)' -c 'SELECT idem_purge()' \
			-c 'VACUUM idem_outbox' >/dev/null
		[ "$(PGDATABASE=obsize q "SELECT count(*) FROM idem_outbox")" = 0 ] ||
			{ say "outbox size: the purge of cycle $c left messages" >&2; exit 1; }
		after=$(PGDATABASE=obsize q "SELECT pg_total_relation_size('idem_outbox')")
		echo "$c $full $after" | tee -a "$OUT/ob_size.txt"
	done
}

# vacuumed_run NAME TABLE...: VACUUM (ANALYZE) the tables, then run NAME
# vacuumed_run NAME CLIENTS TABLE...: run NAME from TABLEs vacuumed
vacuumed_run() {
	local name=$1 clients=$2
	shift 2
	q "VACUUM (ANALYZE) $*" >/dev/null
	run "$name" "$clients"
}

# percentile P: the P-th percentile (nearest rank) of the numbers on stdin
percentile() {
	sort -g | awk -v p="$1" '{a[NR] = $1} END {r = p * NR / 100; i = int(r); if (i < r) i++; if (i < 1) i = 1; print a[i]}'
}

# the outbox part's rows of the report: each ratio is that of the two
# medians beside it; the size's spread is over cycles 2 to 10, since the
# first starts from an empty table
outbox_rows() {
	local i p h b ci cp cb cib min max
	i=$(awk '{print $1}' "$OUT/ob_enqueue.txt" | median)
	p=$(awk '{print $2}' "$OUT/ob_enqueue.txt" | median)
	h=$(awk '{print $3}' "$OUT/ob_enqueue.txt" | median)
	b=$(awk '{print $4}' "$OUT/ob_enqueue.txt" | median)
	ci=$(awk -v n="$OB_CYCLE" '{printf "%.0f\n", $1 * n}' "$OUT/ob_cycle.txt" | median)
	cp=$(awk -v n="$OB_CYCLE" '{printf "%.0f\n", $2 * n}' "$OUT/ob_cycle.txt" | median)
	cb=$(awk -v n="$OB_CYCLE" '{printf "%.0f\n", $3 * n}' "$OUT/ob_cycle.txt" | median)
	cib=$(awk -v n="$OB_CYCLE" '{printf "%.0f\n", $4 * n}' "$OUT/ob_cycle.txt" | median)
	min=$(awk '$1 > 1 {print $2}' "$OUT/ob_size.txt" | sort -n | head -1)
	max=$(awk '$1 > 1 {print $2}' "$OUT/ob_size.txt" | sort -n | tail -1)
	echo "| outbox (a): a business INSERT and one enqueue in a transaction, $CLIENTS clients, tps (median of $ROUNDS): idem_enqueue | $i | pgmq.send $p | idem/pgmq $(ratio "$i" "$p") | ≥ 1.3 |"
	echo "| the same | $i | hand-written INSERT ... ON CONFLICT DO NOTHING into an identical table $h | idem/hand $(ratio "$i" "$h") | ≥ 1.0 |"
	echo "| the same | $i | the business INSERT alone $b | $(ratio "$i" "$b") | |"
	echo "| outbox (b): full cycle of $OB_CYCLE messages, $CLIENTS clients, messages/s (median of $ROUNDS): a business transaction enqueuing $OB_CYCLE (one call per message, in one statement), one take of $OB_CYCLE, a delivery per message (one call each, in one statement) | $ci | pgmq, the same shape (send each, read $OB_CYCLE, archive each) $cp | idem/pgmq $(ratio "$ci" "$cp") | ≥ 1.5 |"
	echo "| outbox (b2): batch cycle of $OB_CYCLE messages, 2 clients, messages/s (median of $ROUNDS): one idem_enqueue_many of $OB_CYCLE in the business transaction, one take of $OB_CYCLE, one idem_delivered_many | $cib | pgmq's batch calls (one send_batch, read $OB_CYCLE, one archive of the ids) $cb | idem/pgmq $(ratio "$cib" "$cb") | ≥ 1.0 |"
	echo "| outbox (c): latency from an enqueue's commit to a LISTENing dispatcher's take, idle server, $OB_LATENCY messages 20 ms apart, ms: p50 | $(percentile 50 <"$OUT/ob_latency.txt") | p90 $(percentile 90 <"$OUT/ob_latency.txt"), p99 $(percentile 99 <"$OUT/ob_latency.txt") | | p50 ≤ 5 |"
	echo "| outbox size over 10 cycles of $OB_SIZE messages (enqueue, take and deliver all, purge, VACUUM), bytes once all are delivered, cycles 2–10 | $min .. $max | first cycle $(awk '$1 == 1 {print $2}' "$OUT/ob_size.txt") | max/min $(ratio "$max" "$min") | ≈ 1 |"
}
outbox_rounds() {
	echo "outbox per-round tps: (a) (idem, pgmq, hand, business INSERT alone): $(tr '\n' ';' <"$OUT/ob_enqueue.txt") (b) and (b2) (idem, pgmq, pgmq batch, idem batch; times $OB_CYCLE for messages/s): $(tr '\n' ';' <"$OUT/ob_cycle.txt") left undelivered after (b) and (b2) (idem, pgmq, pgmq batch, idem batch): $OB_LEFT; outbox size per cycle (cycle, bytes once delivered, bytes after the purge and VACUUM): $(tr '\n' ';' <"$OUT/ob_size.txt")"
}

# What replays write: the WAL and the transaction id of REPLAYS replays of
# finished keys in one statement, as the backend that runs them counts
# them (EXPLAIN (ANALYZE, WAL) counts that backend's WAL only, and
# txid_current_if_assigned() is NULL while it assigned none), after a
# CHECKPOINT.  What the server writes meanwhile is not theirs: the
# position of the WAL before and after a pgbench run counted that too.
REPLAYS=50000
replay_wal() {
	local out
	q "CHECKPOINT" >/dev/null
	out=$(psql -X -Atq -v ON_ERROR_STOP=1 <<SQL
BEGIN;
EXPLAIN (ANALYZE, WAL, FORMAT JSON) SELECT count(*) FROM generate_series(1, $REPLAYS) g,
	LATERAL idem_claim('bench', 'POST /r', 'r' || (1 + g % $NREC), $FP) c WHERE c.outcome = 'replay';
SELECT 'xid=' || coalesce(txid_current_if_assigned()::text, 'none');
COMMIT;
SQL
)
	REPLAY_WAL=$(echo "$out" | sed -n 's/.*"WAL Bytes": \([0-9]*\).*/\1/p' | head -1)
	REPLAY_XID=$(echo "$out" | sed -n 's/^xid=//p')
	echo "$out" | grep -q "\"Actual Rows\": $REPLAYS," ||
		{ say "the WAL measurement did not replay $REPLAYS keys" >&2; exit 1; }
}

# IDEM_BENCH_ONLY=wal: the replays' WAL alone, over a filled table
wal_bench() {
	fill idem_record $SMALL
	replay_wal
}
wal_rows() {
	echo "| WAL written by $REPLAYS replays in one statement, after a CHECKPOINT, bytes | $REPLAY_WAL | | | 0 |"
	echo "| transaction id assigned by them | $REPLAY_XID | | | none |"
}
wal_rounds() { :; }

# IDEM_BENCH_ONLY=clients (issue 22): fresh and replay, idem against the
# hand-written SQL, at CLIENTS and at MANY clients, alternating within each
# round; on 2 cores, 64 clients measure what idem's path costs once every
# backend contends for the same locks, snapshots and shared memory.
MANY=${IDEM_BENCH_MANY:-64}
clients_bench() {
	local r c fi fh ri rh
	for t in idem_record hand_record; do fill $t $SMALL; done
	say "clients: $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $CLIENTS and $MANY clients"
	: >"$OUT/clients.txt"
	for r in $(seq "$ROUNDS"); do
		for c in $CLIENTS $MANY; do
			if [ $((r % 2)) -eq 1 ]; then
				fi=$(run fresh_idem "$c"); fh=$(run fresh_hand "$c")
				ri=$(run replay_idem "$c"); rh=$(run replay_hand "$c")
			else
				rh=$(run replay_hand "$c"); ri=$(run replay_idem "$c")
				fh=$(run fresh_hand "$c"); fi=$(run fresh_idem "$c")
			fi
			echo "$c $fi $fh $ri $rh" | tee -a "$OUT/clients.txt"
		done
	done
}
clients_rows() {
	local c fi fh ri rh
	for c in $CLIENTS $MANY; do
		fi=$(awk -v n="$c" '$1 == n {print $2}' "$OUT/clients.txt" | median)
		fh=$(awk -v n="$c" '$1 == n {print $3}' "$OUT/clients.txt" | median)
		ri=$(awk -v n="$c" '$1 == n {print $4}' "$OUT/clients.txt" | median)
		rh=$(awk -v n="$c" '$1 == n {print $5}' "$OUT/clients.txt" | median)
		echo "| fresh: claim + complete, $c clients, tps (median of $ROUNDS) | $fi | INSERT ... ON CONFLICT + UPDATE $fh | $(ratio "$fi" "$fh") | ≥ 1.05, at $MANY no worse than at $CLIENTS |"
		echo "| replay: claim of a finished key, $c clients, tps (median of $ROUNDS) | $ri | prepared SELECT $rh | $(ratio "$ri" "$rh") | ≥ 1.0, at $MANY no worse than at $CLIENTS |"
	done
}
clients_rounds() {
	echo "per-round tps (clients, fresh idem, fresh hand, replay idem, replay hand): $(tr '\n' ';' <"$OUT/clients.txt")"
}

# IDEM_BENCH_ONLY=freeze (issue 34): fresh claims while another endpoint of
# the tenant and another tenant are frozen, against none frozen, alternating
# within each round.  The check is a look at each backend's copy of
# idem_freeze: nothing when it is empty, a comparison per freeze otherwise.
freeze_bench() {
	local r with without
	say "freeze: $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $CLIENTS clients"
	: >"$OUT/freeze.txt"
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) -eq 1 ]; then
			without=$(run fresh_idem)
			q "SELECT idem_freeze('bench', 'POST /other', 'bench'), idem_freeze('other', NULL, 'bench')" >/dev/null
			with=$(run fresh_idem)
			q "SELECT idem_thaw('bench', 'POST /other'), idem_thaw('other', NULL)" >/dev/null
		else
			q "SELECT idem_freeze('bench', 'POST /other', 'bench'), idem_freeze('other', NULL, 'bench')" >/dev/null
			with=$(run fresh_idem)
			q "SELECT idem_thaw('bench', 'POST /other'), idem_thaw('other', NULL)" >/dev/null
			without=$(run fresh_idem)
		fi
		echo "$with $without" | tee -a "$OUT/freeze.txt"
	done
}
freeze_rows() {
	local w o
	w=$(awk '{print $1}' "$OUT/freeze.txt" | median)
	o=$(awk '{print $2}' "$OUT/freeze.txt" | median)
	echo "| fresh: claim + complete with two other endpoints frozen, $CLIENTS clients, tps (median of $ROUNDS) | $w | none frozen $o | $(ratio "$w" "$o") | ≥ 0.98 |"
}
freeze_rounds() {
	echo "per-round tps (frozen others, none): $(tr '\n' ';' <"$OUT/freeze.txt")"
}

# IDEM_BENCH_ONLY=scale (issue 33): with autovacuum on, as production runs.
# Database bench holds SMALL finished records and database bench_big BIG,
# both loaded through idem's own batch calls (idem_claim_many and
# idem_complete_many, 100,000 keys a call); fresh claims and replays
# alternate between the two within each round.  Then bench_big gets BIG
# more records whose retention has run out, and the worker purges them
# while CLIENTS clients claim fresh keys in database bench: their tps in
# 5-second runs until the purge is done, against 5-second runs before it.
# idem_load DB FROM TO LEASE RETENTION: records rFROM..rTO, finished, in DB
idem_load() {
	local db=$1 from=$2 last=$3 lease=$4 retention=$5 to
	while [ "$from" -le "$last" ]; do
		to=$((from + 99999))
		[ "$to" -le "$last" ] || to=$last
		psql -X -q -d "$db" -v ON_ERROR_STOP=1 >/dev/null <<SQL
SET idem.retry_window = '1s';
SELECT count(*) FROM idem_claim_many('bench', 'POST /r', (SELECT array_agg('r' || g) FROM generate_series($from, $to) g), array_fill($FP, ARRAY[$to - $from + 1]), lease => '$lease', retention => '$retention');
SELECT idem_complete_many('bench', 'POST /r', (SELECT array_agg('r' || g) FROM generate_series($from, $to) g), array_fill(201, ARRAY[$to - $from + 1]), array_fill($BODY, ARRAY[$to - $from + 1]));
SQL
		from=$((to + 1))
	done
}
# whether autovacuum has nothing due on idem_record of database $1: no
# vacuum of it running, and its dead and inserted rows under autovacuum's
# thresholds (the defaults, which the bench's server keeps)
settled() {
	PGDATABASE=$1 q "SELECT coalesce(bool_and(c.reltuples >= 0 AND
			s.n_dead_tup <= 50 + 0.2 * c.reltuples AND
			s.n_ins_since_vacuum <= 1000 + 0.2 * c.reltuples AND
			NOT EXISTS (SELECT FROM pg_stat_progress_vacuum v WHERE v.relid = c.oid)), false)
		  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
		 WHERE s.relname = 'idem_record'"
}
scale_bench() {
	local r fs fb rs rb hs hb start n before
	q "ALTER SYSTEM SET autovacuum = on" >/dev/null
	q "SELECT pg_reload_conf()" >/dev/null
	createdb bench_big
	PGDATABASE=bench_big q 'CREATE EXTENSION idem'
	say "scale: loading $SMALL and $BIG records through idem_claim_many and idem_complete_many"
	idem_load bench 1 "$SMALL" '5 minutes' '24 hours'
	start=$(date +%s.%N)
	idem_load bench_big 1 "$BIG" '5 minutes' '24 hours'
	SCALE_LOAD_S=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.0f", e - s}')
	# the floor at both sizes: a prepared SELECT of the same rows by hand,
	# which tells the memory hierarchy's share from idem's
	PGDATABASE=bench_big q "CREATE TABLE hand_record (LIKE idem_record INCLUDING ALL) WITH (fillfactor = 70)"
	fill hand_record $SMALL
	PGDATABASE=bench_big fill hand_record $BIG
	# the tables at rest, as a production table is between its autovacuums:
	# the load leaves the vacuum that its inserts and updates are due, and
	# that vacuum would take one of the two cores in the middle of a round
	say "scale: waiting for autovacuum to finish what the load left it"
	start=$(date +%s.%N)
	until [ "$(settled bench)" = t ] && [ "$(settled bench_big)" = t ]; do
		if [ "$(awk -v s="$start" -v e="$(date +%s)" 'BEGIN {print e - s > 3600}')" = 1 ]; then
			say "scale: autovacuum is not done after an hour; measuring beside it"
			break
		fi
		sleep 5
	done
	SCALE_SETTLE_S=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.0f", e - s}')
	say "scale: $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $SMALL against $BIG records"
	: >"$OUT/scale_rounds.txt"
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) -eq 1 ]; then
			NREC=$SMALL fs=$(run fresh_idem); NREC=$BIG fb=$(PGDATABASE=bench_big run fresh_idem)
			NREC=$SMALL rs=$(run replay_idem); NREC=$BIG rb=$(PGDATABASE=bench_big run replay_idem)
			NREC=$SMALL hs=$(run replay_hand); NREC=$BIG hb=$(PGDATABASE=bench_big run replay_hand)
		else
			NREC=$BIG hb=$(PGDATABASE=bench_big run replay_hand); NREC=$SMALL hs=$(run replay_hand)
			NREC=$BIG rb=$(PGDATABASE=bench_big run replay_idem); NREC=$SMALL rs=$(run replay_idem)
			NREC=$BIG fb=$(PGDATABASE=bench_big run fresh_idem); NREC=$SMALL fs=$(run fresh_idem)
		fi
		echo "$fs $fb $rs $rb $hs $hb" | tee -a "$OUT/scale_rounds.txt"
	done

	: >"$OUT/scale_purge.txt"
	case ${IDEM_BENCH_SCALE_PURGE:-yes} in
	no) return ;;
	esac
	say "scale: $BIG expired records in bench_big, purged while bench claims"
	# a record outlives its lease: each batch is finished within 10 s of
	# its claims, and all have expired 20 s after the last
	idem_load bench_big $((BIG + 1)) $((2 * BIG)) '10 seconds' '20 seconds'
	# IDEM_BENCH_SCALE_PURGE_AUTOVACUUM=off: autovacuum leaves the purged
	# table alone, to tell its share of the traffic's drop from the purge's
	SCALE_PURGE_AV=${IDEM_BENCH_SCALE_PURGE_AUTOVACUUM:-on}
	case $SCALE_PURGE_AV in
	on) ;;
	off) PGDATABASE=bench_big q "ALTER TABLE idem_record SET (autovacuum_enabled = off)" >/dev/null ;;
	*) say "IDEM_BENCH_SCALE_PURGE_AUTOVACUUM=$SCALE_PURGE_AV: only on and off are known" >&2; exit 1 ;;
	esac
	sleep 21
	for r in 1 2 3; do
		echo "before $(run fresh_idem "$CLIENTS" 5)" | tee -a "$OUT/scale_purge.txt"
	done
	q "SELECT idem_stats_reset()" >/dev/null
	PGDATABASE=bench_big q "SELECT idem_stats_reset()" >/dev/null
	q "ALTER SYSTEM SET idem.purge_interval = '100ms'" >/dev/null
	[ -z "${IDEM_BENCH_PURGE_PAUSE:-}" ] ||
		q "ALTER SYSTEM SET idem.purge_pause = $IDEM_BENCH_PURGE_PAUSE" >/dev/null
	start=$(date +%s.%N)
	q "SELECT pg_reload_conf()" >/dev/null
	SCALE_PAUSE=$(q 'SHOW idem.purge_pause')
	# watch the counter, not the table: a scan would hold back the purge
	until [ "$(PGDATABASE=bench_big q "SELECT purged >= $BIG FROM idem_stats WHERE datname = 'bench_big'")" = t ]; do
		echo "during $(run fresh_idem "$CLIENTS" 5)" | tee -a "$OUT/scale_purge.txt"
	done
	SCALE_PURGE_S=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
	q "ALTER SYSTEM SET idem.purge_interval = '1h'" >/dev/null
	q "ALTER SYSTEM RESET idem.purge_pause" >/dev/null
	q "SELECT pg_reload_conf()" >/dev/null
}
scale_rows() {
	local fs fb rs rb hs hb before during
	fs=$(awk '{print $1}' "$OUT/scale_rounds.txt" | median)
	fb=$(awk '{print $2}' "$OUT/scale_rounds.txt" | median)
	rs=$(awk '{print $3}' "$OUT/scale_rounds.txt" | median)
	rb=$(awk '{print $4}' "$OUT/scale_rounds.txt" | median)
	hs=$(awk '{print $5}' "$OUT/scale_rounds.txt" | median)
	hb=$(awk '{print $6}' "$OUT/scale_rounds.txt" | median)
	before=$(awk '$1 == "before" {print $2}' "$OUT/scale_purge.txt" | median)
	during=$(awk '$1 == "during" {print $2}' "$OUT/scale_purge.txt" | median)
	echo "| fresh: claim + complete at $BIG records, $CLIENTS clients, autovacuum on, tps (median of $ROUNDS) | $fb | at $SMALL records $fs | $(ratio "$fb" "$fs") | ≥ 0.9 |"
	echo "| replay at $BIG records, tps (median of $ROUNDS) | $rb | at $SMALL records $rs | $(ratio "$rb" "$rs") | ≥ 0.9 |"
	echo "| the floor: prepared SELECT of hand_record at $BIG records, tps (median of $ROUNDS) | $hb | at $SMALL records $hs | $(ratio "$hb" "$hs") | |"
	echo "| replay against that SELECT at $BIG records | $rb | $hb | $(ratio "$rb" "$hb") | |"
	[ -s "$OUT/scale_purge.txt" ] || return 0
	echo "| purge of $BIG expired records by the worker (database bench_big, idem.purge_pause $SCALE_PAUSE, autovacuum $SCALE_PURGE_AV for its idem_record), rows/s | $(awk -v n="$BIG" -v s="$SCALE_PURGE_S" 'BEGIN {printf "%.0f", n / s}') (${SCALE_PURGE_S}s) | | | within minutes |"
	echo "| fresh in database bench meanwhile, $CLIENTS clients, tps (median of the 5-second runs) | $during | before the purge $before | $(ratio "$during" "$before") | ≥ 0.8 |"
}
scale_rounds() {
	echo "loading $BIG records through the batch calls: ${SCALE_LOAD_S}s; autovacuum done with them after ${SCALE_SETTLE_S}s more; per-round tps (fresh at $SMALL, at $BIG, replay at $SMALL, at $BIG, hand SELECT at $SMALL, at $BIG): $(tr '\n' ';' <"$OUT/scale_rounds.txt") runs around the purge: $(tr '\n' ';' <"$OUT/scale_purge.txt")"
}

# IDEM_BENCH_ONLY=sql (issue 32): the SQL edition's fresh claim+complete
# and replay against the hand-written PL/pgSQL (plpg_claim, plpg_complete)
# and against the C edition, alternating within each round.  The edition
# is installed by sql-edition/idem.sql into database bench_sql, owned by
# role bench_app, which is no superuser and makes the calls, as on a
# managed service; the baselines run in database bench.
sql_bench() {
	local r w e p c
	python3 sql-edition/generate.py >/dev/null
	q "CREATE ROLE bench_app LOGIN" >/dev/null
	q "CREATE DATABASE bench_sql OWNER bench_app" >/dev/null
	PGDATABASE=bench_sql q "ALTER SCHEMA public OWNER TO bench_app" >/dev/null
	PGDATABASE=bench_sql PGUSER=bench_app psql -X -q -v ON_ERROR_STOP=1 \
		-f sql-edition/idem.sql >/dev/null
	for t in idem_record plpg_record; do fill $t $SMALL; done
	PGDATABASE=bench_sql PGUSER=bench_app fill idem_record $SMALL
	say "sql: $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $CLIENTS clients"
	: >"$OUT/sql.txt"
	for r in $(seq "$ROUNDS"); do
		for w in fresh replay; do
			if [ $((r % 2)) -eq 1 ]; then
				e=$(PGDATABASE=bench_sql PGUSER=bench_app run ${w}_idem)
				p=$(run ${w}_plpgsql); c=$(run ${w}_idem)
			else
				c=$(run ${w}_idem); p=$(run ${w}_plpgsql)
				e=$(PGDATABASE=bench_sql PGUSER=bench_app run ${w}_idem)
			fi
			echo "$w $e $p $c" | tee -a "$OUT/sql.txt"
		done
	done
}
sql_rows() {
	local w e p c what
	for w in fresh replay; do
		e=$(awk -v w="$w" '$1 == w {print $2}' "$OUT/sql.txt" | median)
		p=$(awk -v w="$w" '$1 == w {print $3}' "$OUT/sql.txt" | median)
		c=$(awk -v w="$w" '$1 == w {print $4}' "$OUT/sql.txt" | median)
		what="fresh: claim + complete"
		[ "$w" = replay ] && what="replay: claim of a finished key"
		echo "| SQL edition, $what, $CLIENTS clients, tps (median of $ROUNDS) | $e | hand-written PL/pgSQL $p | $(ratio "$e" "$p") | ≥ 1.0 |"
		echo "| the same | $e | C edition $c | $(ratio "$e" "$c") | $([ "$w" = fresh ] && echo "≥ 0.8") |"
	done
}
sql_rounds() {
	echo "per-round tps (SQL edition, PL/pgSQL, C edition): $(tr '\n' ';' <"$OUT/sql.txt")"
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

machine() {
	echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), PostgreSQL $(postgres -V | awk '{print $3}')"
}
batch_rounds() {
	echo "per-round ms ((a) per key, (b) idem_claim_many, (c) INSERT, (d) INSERT ON CONFLICT): $(tr '\n' ';' <"$OUT/batch_stmt.txt") consumer tps (single, batch): $(tr '\n' ';' <"$OUT/consumer.txt")"
}

NREC=$SMALL
if [ -n "${IDEM_BENCH_ONLY:-}" ]; then
	"${IDEM_BENCH_ONLY}_bench"
	{
		echo "| measure | idem | baseline | ratio | target |"
		echo "|---|---|---|---|---|"
		"${IDEM_BENCH_ONLY}_rows"
	} | tee "$OUT/results.md"
	echo
	{ machine; "${IDEM_BENCH_ONLY}_rounds"; } | tee -a "$OUT/results.md"
	exit 0
fi
for t in idem_record hand_record plpg_record; do fill $t $SMALL; done

# fresh: claim + complete, against the two writes by hand and PL/pgSQL
say "fresh: $ROUNDS rounds of ${SECONDS_PER_RUN}s each, $CLIENTS clients"
: >"$OUT/fresh.txt"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) -eq 1 ]; then
		i=$(run fresh_idem); h=$(run fresh_hand); p=$(run fresh_plpgsql)
	else
		p=$(run fresh_plpgsql); h=$(run fresh_hand); i=$(run fresh_idem)
	fi
	echo "$i $h $p" | tee -a "$OUT/fresh.txt"
done
q "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1 || true
sleep 1
HOT=$(q "SELECT round(100.0 * n_tup_hot_upd / nullif(n_tup_upd, 0), 2) FROM pg_stat_user_tables WHERE relname = 'idem_record'")

# replay: a claim of a finished key, against a prepared SELECT by the key
say "replay"
: >"$OUT/replay.txt"
for r in $(seq "$ROUNDS"); do
	i=$(run replay_idem)
	h=$(run replay_hand); p=$(run replay_plpgsql)
	echo "$i $h $p" | tee -a "$OUT/replay.txt"
done
replay_wal

# contention: 32 clients on 10 keys, a new generation of keys every 100 ms
say "contention"
q "SELECT idem_stats_reset()" >/dev/null
CONT_TPS=$(run contention 32)
CONT_OUT=$(q "SELECT claims_claimed || ' claimed, ' || claims_replay || ' replay, ' || claims_in_progress || ' in_progress' FROM idem_stats WHERE datname = 'bench'")

# batch: 100,000 claims in one transaction, default settings, while
# another session claims
say "batch"
BATCH_START=$(date +%s.%N)
q "SELECT count(*) FROM generate_series(1, 100000) g, LATERAL idem_claim('batch', 'POST /b', 'b' || g) c WHERE c.outcome = 'claimed'" >"$OUT/batch.txt" &
BATCH_PID=$!
BATCH_OTHER_TPS=$(run fresh_idem "$CLIENTS" 5)
wait "$BATCH_PID"
BATCH_S=$(awk -v s="$BATCH_START" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
BATCH_CLAIMED=$(cat "$OUT/batch.txt")
batch_bench
outbox_bench

# purge: a million expired records, purged by the worker while claims run,
# its batches back to back (idem.purge_pause 0): the purge's own speed; the
# scale part measures it paced, at the default
say "purge"
BASE_TPS=$(run fresh_idem "$CLIENTS" 5)
psql -X -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO idem_record (tenant, endpoint, key, state, status, body, attempt,
	created_at, claimed_at, lease_expires_at, finished_at, expires_at)
SELECT 'old', 'POST /o', 'o' || i, 'succeeded', 201, $BODY, 1,
	now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
	now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 1000000) i;
VACUUM ANALYZE idem_record;
SQL
q "SELECT idem_stats_reset()" >/dev/null
q "ALTER SYSTEM SET idem.purge_interval = '100ms'" >/dev/null
q "ALTER SYSTEM SET idem.purge_pause = 0" >/dev/null
START=$(date +%s.%N)
q "SELECT pg_reload_conf()" >/dev/null
DURING_TPS=$(run fresh_idem "$CLIENTS" 5)
# watch the counter, not the table: a scan would hold back the purge
until [ "$(q "SELECT purged >= 1000000 FROM idem_stats WHERE datname = 'bench'")" = t ]; do sleep 0.1; done
PURGE_S=$(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
PURGE_RATE=$(awk -v s="$PURGE_S" 'BEGIN {printf "%.0f", 1000000 / s}')
q "ALTER SYSTEM SET idem.purge_interval = '1h'" >/dev/null
q "ALTER SYSTEM RESET idem.purge_pause" >/dev/null
q "SELECT pg_reload_conf()" >/dev/null
q "VACUUM ANALYZE idem_record" >/dev/null

# scale: fresh and replay at SMALL and BIG records
say "scale: $SMALL and $BIG records"
scale_line() {
	local n=$1 fi fh ri rh
	NREC=$n
	fi=$(run fresh_idem); fh=$(run fresh_hand); ri=$(run replay_idem); rh=$(run replay_hand)
	echo "$n $fi $fh $ri $rh" | tee -a "$OUT/scale.txt"
}
: >"$OUT/scale.txt"
scale_line $SMALL
for t in idem_record hand_record; do fill $t "$BIG"; done
scale_line "$BIG"

# size: bytes per record, and the table's size over 10 cycles of fill,
# expire and purge (VACUUM after each purge stands for autovacuum); the
# lease is shorter than the retention, or it would extend the expiry
say "size: 10 cycles of 50000 records"
createdb sizedb
psql -X -q -d sizedb -c 'CREATE EXTENSION idem'
: >"$OUT/size.txt"
for c in $(seq 10); do
	psql -X -q -d sizedb -v ON_ERROR_STOP=1 <<SQL >/dev/null
SET idem.retry_window = '1s';
SET idem.retention = '3s';
SET idem.lease = '1s';
DO \$\$
BEGIN
	FOR i IN 1..50000 LOOP
		PERFORM idem_claim('size', 'POST /s', 'c$c-' || i, $FP);
		PERFORM idem_complete('size', 'POST /s', 'c$c-' || i, 201, $BODY);
		IF i % 1000 = 0 THEN
			COMMIT;
		END IF;
	END LOOP;
END
\$\$;
SQL
	full=$(psql -X -Atq -d sizedb -c "SELECT pg_total_relation_size('idem_record')")
	sleep 3
	psql -X -q -d sizedb -c 'SELECT idem_purge()' -c 'VACUUM idem_record' >/dev/null
	echo "$c $full" | tee -a "$OUT/size.txt"
done
PER_RECORD=$(awk 'NR == 1 {printf "%.0f", $2 / 50000}' "$OUT/size.txt")
SIZE_MIN=$(awk '{print $2}' "$OUT/size.txt" | sort -n | head -1)
SIZE_MAX=$(awk '{print $2}' "$OUT/size.txt" | sort -n | tail -1)
SIZE_SPREAD=$(awk -v a="$SIZE_MIN" -v b="$SIZE_MAX" 'BEGIN {printf "%.1f", 100 * (b - a) / a}')

# the report: each ratio is the ratio of the two tps printed beside it
medtps() { awk -v c="$2" '{print $c}' "$OUT/$1.txt" | median; }
col() { awk -v n="$1" -v c="$2" '$1 == n {print $c}' "$OUT/scale.txt"; }
F_I=$(medtps fresh 1); F_H=$(medtps fresh 2); F_P=$(medtps fresh 3)
R_I=$(medtps replay 1); R_H=$(medtps replay 2); R_P=$(medtps replay 3)
S_FI=$(col $SMALL 2); S_FH=$(col $SMALL 3); S_RI=$(col $SMALL 4); S_RH=$(col $SMALL 5)
B_FI=$(col "$BIG" 2); B_FH=$(col "$BIG" 3); B_RI=$(col "$BIG" 4); B_RH=$(col "$BIG" 5)
{
	echo "| measure | idem | baseline | ratio | target |"
	echo "|---|---|---|---|---|"
	echo "| fresh: claim + complete, tps (median of $ROUNDS) | $F_I | hand-written SQL $F_H | $(ratio "$F_I" "$F_H") | ≥ 1.05 |"
	echo "| fresh, tps | $F_I | PL/pgSQL $F_P | $(ratio "$F_I" "$F_P") | ≥ 1.5 |"
	echo "| replay: claim of a finished key, tps (median of $ROUNDS) | $R_I | prepared SELECT $R_H | $(ratio "$R_I" "$R_H") | ≥ 1.0 |"
	echo "| replay, tps | $R_I | PL/pgSQL $R_P | $(ratio "$R_I" "$R_P") | |"
	echo "| WAL written by $REPLAYS replays in one statement, after a CHECKPOINT, bytes | $REPLAY_WAL | | | 0 |"
	echo "| transaction id assigned by them | $REPLAY_XID | | | none |"
	echo "| completes that were HOT updates | $HOT % | | | ≥ 99 % |"
	echo "| contention: 32 clients on 10 keys, answers/s | $CONT_TPS ($CONT_OUT), no errors | | | |"
	echo "| 100,000 claims in one transaction (default settings), claimed | $BATCH_CLAIMED in ${BATCH_S}s | another session's fresh tps meanwhile $BATCH_OTHER_TPS | | all claimed, no error |"
	batch_rows
	outbox_rows
	echo "| purge of 1M expired records by the worker, idem.purge_pause 0, rows/s | $PURGE_RATE (${PURGE_S}s) | | | ≥ 100000 |"
	echo "| fresh tps during the purge (unpaced) | $DURING_TPS | without $BASE_TPS | $(ratio "$DURING_TPS" "$BASE_TPS") | ≥ 0.90 |"
	echo "| fresh at $SMALL records, tps | $S_FI | hand-written SQL $S_FH | $(ratio "$S_FI" "$S_FH") | |"
	echo "| fresh at $BIG records, tps | $B_FI | hand-written SQL $B_FH | $(ratio "$B_FI" "$B_FH") | ≥ the ratio at $SMALL |"
	echo "| replay at $SMALL records, tps | $S_RI | prepared SELECT $S_RH | $(ratio "$S_RI" "$S_RH") | |"
	echo "| replay at $BIG records, tps | $B_RI | prepared SELECT $B_RH | $(ratio "$B_RI" "$B_RH") | ≥ the ratio at $SMALL |"
	echo "| bytes per record (table + indexes, 200 B request, 100 B response) | $PER_RECORD | | | |"
	echo "| table size over 10 fill/expire/purge cycles | $SIZE_MIN .. $SIZE_MAX bytes | | spread $SIZE_SPREAD % | ≤ 10 % |"
} | tee "$OUT/results.md"
echo
{
	machine
	echo "per-round tps (idem, hand, PL/pgSQL): fresh $(tr '\n' ';' <"$OUT/fresh.txt") replay $(tr '\n' ';' <"$OUT/replay.txt")"
	batch_rounds
	outbox_rounds
} | tee -a "$OUT/results.md"

# the chart: tps against record count
gnuplot <<GP
set terminal pngcairo size 800,500
set output "$OUT/bench.png"
set title "idem against hand-written SQL, $CLIENTS clients"
set xlabel "records in the table"
set ylabel "transactions per second"
set logscale x
set key outside
set xrange [$SMALL / 2 : $BIG * 2]
set yrange [0 : *]
set xtics ($SMALL, $BIG)
plot "$OUT/scale.txt" using 1:2 with linespoints title "fresh: idem", \
     "" using 1:3 with linespoints title "fresh: by hand", \
     "" using 1:4 with linespoints title "replay: idem", \
     "" using 1:5 with linespoints title "replay: prepared SELECT"
GP
say "wrote $OUT/results.md and $OUT/bench.png"
