#!/usr/bin/env bash
# test/demo.sh: "make run" and "make stop".
#
# start: build idem, install it, start a private throwaway server with idem
# preloaded (in $IDEM_RUN_DIR, default /tmp/idem-run, port $IDEM_PORT,
# default 5499, Unix socket only), and run test/demo.sql against it.
# stop: stop that server and remove its directory.
#
# As root, idem is installed into the system's PostgreSQL and the server
# runs as the postgres user.  As another user, idem is installed into the
# system's PostgreSQL if that user may write there, and otherwise into a
# private copy of the installation (tmp_install/).
set -euo pipefail
cd "$(dirname "$0")/.."
. test/lib.sh

RUN_DIR=${IDEM_RUN_DIR:-/tmp/idem-run}
PORT=${IDEM_PORT:-5499}

# run a command as the user the server runs as
as_server() {
	if is_root; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

stop_server() {
	local pg_ctl=$1
	if [ -f "$RUN_DIR/data/postmaster.pid" ]; then
		as_server "$pg_ctl" -D "$RUN_DIR/data" -m fast -w stop >/dev/null || true
	fi
	rm -rf "$RUN_DIR"
}

ensure_packages
pg_dirs

case "${1:-start}" in
stop)
	bin=$PG_BINDIR
	[ -x "tmp_install$PG_BINDIR/pg_ctl" ] && bin=$PWD/tmp_install$PG_BINDIR
	stop_server "$bin/pg_ctl"
	say "stopped the server in $RUN_DIR"
	exit 0
	;;
start) ;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac

say "building"
make -s PG_CONFIG="$PG_CONFIG" >/dev/null
if is_root || [ -w "$PG_PKGLIBDIR" ]; then
	say "installing into $PG_PKGLIBDIR and $PG_SHAREDIR/extension"
	make -s install PG_CONFIG="$PG_CONFIG" >/dev/null
	BIN=$PG_BINDIR
else
	say "no write access to $PG_PKGLIBDIR: installing into a private copy in tmp_install/"
	private_install "$PWD/tmp_install"
	BIN=$PWD/tmp_install$PG_BINDIR
fi

stop_server "$BIN/pg_ctl"
mkdir -p "$RUN_DIR"
is_root && chown postgres: "$RUN_DIR"
say "starting a server in $RUN_DIR on port $PORT"
as_server "$BIN/initdb" -D "$RUN_DIR/data" -U postgres -A trust --no-sync >"$RUN_DIR/initdb.log" 2>&1 ||
	{ cat "$RUN_DIR/initdb.log"; exit 1; }
cat >>"$RUN_DIR/data/postgresql.conf" <<CONF
shared_preload_libraries = 'idem'
listen_addresses = ''
unix_socket_directories = '$RUN_DIR'
port = $PORT
CONF
as_server "$BIN/pg_ctl" -D "$RUN_DIR/data" -l "$RUN_DIR/server.log" -w start >/dev/null ||
	{ cat "$RUN_DIR/server.log"; exit 1; }

PSQL=("$BIN/psql" -X -h "$RUN_DIR" -p "$PORT" -U postgres)
"${PSQL[@]}" -q -d postgres -c 'CREATE DATABASE idem'
"${PSQL[@]}" -q -d idem -v ON_ERROR_STOP=1 -f test/demo.sql

cat <<MSG

idem: the server keeps running with idem preloaded.
  connect:  ${PSQL[*]} -d idem
  log:      $RUN_DIR/server.log
  docs:     the SQL of a page of README.md or doc/*.md runs here as written,
            in the page's order (test/t/081_doc_snippets.pl checks it)
  stop:     make stop   (stops it and removes $RUN_DIR)
MSG
