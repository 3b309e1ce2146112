"""test/bench/latency.py N GAP: the outbox's latency from an enqueue's
commit to a LISTENing dispatcher's take (test/bench.sh, on an otherwise
idle server).

A thread enqueues N messages of topic "lat", GAP seconds apart, each in a
transaction with a business INSERT; a message's payload is the
clock_timestamp() of its enqueuing statement, the transaction's last
before COMMIT.  The main thread is the dispatcher: it LISTENs on
idem_outbox and, on each notification, takes up to 100 messages of the
topic; the take's statement reads clock_timestamp() after the take, so
each latency is one server clock minus itself.  Prints one latency per
message, in ms.  The connections come from libpq's environment (PGHOST,
PGPORT, PGDATABASE); Debian's python3 and psycopg 3.1, whose notifies()
has no timeout: the dispatcher waits with select() on the socket.
"""
import select
import sys
import threading
import time

import psycopg

N = int(sys.argv[1])
GAP = float(sys.argv[2])


def enqueue():
    with psycopg.connect(autocommit=True) as conn:
        for i in range(N):
            with conn.transaction():
                conn.execute("INSERT INTO orders (item) VALUES ('latency')")
                conn.execute(
                    "SELECT idem_enqueue('bench', 'lat', %s,"
                    " convert_to(clock_timestamp()::text, 'UTF8'))",
                    (f"l{i}",))
            time.sleep(GAP)


def main():
    latencies = []
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("LISTEN idem_outbox")
        # notifications that arrive while a take runs are read by psycopg
        # with the take's result: they land here, not on the socket
        pending = []
        conn.add_notify_handler(pending.append)
        enqueuer = threading.Thread(target=enqueue, daemon=True)
        enqueuer.start()
        deadline = time.monotonic() + N * GAP + 30
        while len(latencies) < N:
            if time.monotonic() > deadline:
                sys.exit(f"latency: {len(latencies)} of {N} messages taken in time")
            if not pending:
                if select.select([conn.fileno()], [], [], 1)[0]:
                    conn.pgconn.consume_input()
                    while (n := conn.pgconn.notifies()) is not None:
                        pending.append(n)
                continue
            # nothing else runs meanwhile: every notification is for "lat"
            pending.clear()
            for (ms,) in conn.execute(
                    "SELECT (1000 * extract(epoch FROM clock_timestamp()"
                    " - convert_from(payload, 'UTF8')::timestamptz))::float8"
                    " FROM idem_take('lat', 100)"):
                latencies.append(ms)
        enqueuer.join()
    for ms in latencies:
        print(f"{ms:.3f}")


main()
