-- test/bench/outbox.sql: the outbox part's tables (test/bench.sh).

-- the business table that every enqueuing transaction writes too
CREATE TABLE orders (id bigserial PRIMARY KEY, item text);

-- the floor: idem_outbox's columns, CHECK constraints and indexes (the
-- partial ones too) under another name, written by hand; its ids come
-- from a sequence, as idem_outbox's do
CREATE TABLE hand_outbox (LIKE idem_outbox INCLUDING ALL);
CREATE SEQUENCE hand_outbox_id_seq AS bigint OWNED BY hand_outbox.id;

-- the peer: pgmq's queues, one per measure so that none reads another's
-- leftovers
CREATE EXTENSION pgmq;
SELECT pgmq.create('bench');
SELECT pgmq.create('cycle');
SELECT pgmq.create('cycle_batch');
