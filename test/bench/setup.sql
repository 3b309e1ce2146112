-- test/bench/setup.sql: idem and its two baselines on identical tables.
CREATE EXTENSION idem;

-- the floor: the same table, written by hand
CREATE TABLE hand_record (LIKE idem_record INCLUDING ALL) WITH (fillfactor = 70);

-- what a user would otherwise write: the same protocol in PL/pgSQL
\ir plpg.sql
