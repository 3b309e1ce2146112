--
-- shape.sql: idem's tables as idem requires them.  An index that a
-- superuser rebuilt with another definition is refused where it is looked
-- up, naming the index and the definition idem requires; as the install
-- script makes it, it serves again.  A trigger on INSERT or UPDATE, a
-- foreign key and a deferrable constraint (checked by row triggers), none
-- of which idem fires on its direct writes, are refused at the next call,
-- naming them; a disabled trigger, a trigger on DELETE and a foreign key
-- that references the table are not.
--
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT outcome FROM idem_claim('globex', 'pay', 'acme');
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);

-- the key index with its columns in another order: a probe by position
-- would find another tenant's record
DROP INDEX idem_record_key;
CREATE UNIQUE INDEX idem_record_key ON idem_record (key, endpoint, tenant);
SELECT outcome FROM idem_claim('acme', 'pay', 'globex');
SELECT outcome FROM idem_replay('acme', 'pay', 'globex');
-- not unique: two claims of one key would both insert
DROP INDEX idem_record_key;
CREATE INDEX idem_record_key ON idem_record (tenant, endpoint, key);
SELECT outcome FROM idem_claim('acme', 'pay', 'k');
-- with a predicate
DROP INDEX idem_record_key;
CREATE UNIQUE INDEX idem_record_key ON idem_record (tenant, endpoint, key)
	WHERE state <> 'failed';
SELECT outcome FROM idem_claim('acme', 'pay', 'k');
-- descending
DROP INDEX idem_record_key;
CREATE UNIQUE INDEX idem_record_key ON idem_record (tenant, endpoint, key DESC);
SELECT outcome FROM idem_claim('acme', 'pay', 'k');
-- as the install script makes it
DROP INDEX idem_record_key;
CREATE UNIQUE INDEX idem_record_key ON idem_record (tenant, endpoint, key);
SELECT outcome FROM idem_claim('acme', 'pay', 'globex');
SELECT outcome FROM idem_claim('globex', 'pay', 'acme');

-- the fencing floor's key
ALTER TABLE idem_attempt_floor DROP CONSTRAINT idem_attempt_floor_pkey;
CREATE INDEX idem_attempt_floor_pkey ON idem_attempt_floor (bucket);
SELECT outcome FROM idem_claim('acme', 'pay', 'k2');
DROP INDEX idem_attempt_floor_pkey;
ALTER TABLE idem_attempt_floor ADD CONSTRAINT idem_attempt_floor_pkey PRIMARY KEY (bucket);
SELECT outcome FROM idem_claim('acme', 'pay', 'k2');

-- the outbox's key index in another order would mix tenants' messages
DROP INDEX idem_outbox_key;
CREATE UNIQUE INDEX idem_outbox_key ON idem_outbox (tenant, key, topic);
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm2', 'x'::bytea);
DROP INDEX idem_outbox_key;
CREATE UNIQUE INDEX idem_outbox_key ON idem_outbox (tenant, topic, key);
-- the take's index in another order, or without its predicate
DROP INDEX idem_outbox_due;
CREATE INDEX idem_outbox_due ON idem_outbox (not_before, topic, id)
	WHERE state IN ('queued', 'leased');
SELECT count(*) FROM idem_take('mail', 10);
DROP INDEX idem_outbox_due;
CREATE INDEX idem_outbox_due ON idem_outbox (topic, not_before, id);
SELECT count(*) FROM idem_take('mail', 10);
DROP INDEX idem_outbox_due;
CREATE INDEX idem_outbox_due ON idem_outbox (topic, not_before, id)
	WHERE state IN ('queued', 'leased', 'dead');
SELECT count(*) FROM idem_take('mail', 10);
DROP INDEX idem_outbox_due;
CREATE INDEX idem_outbox_due ON idem_outbox (topic, not_before, id)
	WHERE state IN ('queued', 'leased');
-- a session that quotes every identifier looks the indexes up alike
SET quote_all_identifiers = on;
DROP INDEX idem_outbox_due;
CREATE INDEX idem_outbox_due ON idem_outbox (topic, not_before, id)
	WHERE state IN ('queued', 'leased');
SELECT count(*) FROM idem_take('nothing', 10);
RESET quote_all_identifiers;
-- the ordering key's index with an expression
DROP INDEX idem_outbox_order;
CREATE INDEX idem_outbox_order ON idem_outbox (tenant, topic, lower(ordering_key), id)
	WHERE ordering_key IS NOT NULL AND state IN ('queued', 'leased', 'unknown');
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm2', 'x'::bytea);
DROP INDEX idem_outbox_order;
CREATE INDEX idem_outbox_order ON idem_outbox (tenant, topic, ordering_key, id)
	WHERE ordering_key IS NOT NULL AND state IN ('queued', 'leased', 'unknown');
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm2', 'x'::bytea);
SELECT key, attempt FROM idem_take('mail', 10) ORDER BY key;

-- row triggers
CREATE TABLE fired (what text);
CREATE FUNCTION note_row() RETURNS trigger LANGUAGE plpgsql AS
	$$ BEGIN INSERT INTO fired VALUES (TG_TABLE_NAME || ' ' || TG_OP); RETURN NULL; END $$;
CREATE TRIGGER audit BEFORE INSERT ON idem_record FOR EACH ROW EXECUTE FUNCTION note_row();
SELECT outcome FROM idem_claim('acme', 'pay', 't1');
SELECT outcome FROM idem_replay('acme', 'pay', 'globex');
ALTER TABLE idem_record DISABLE TRIGGER audit;
SELECT outcome FROM idem_claim('acme', 'pay', 't1');
DROP TRIGGER audit ON idem_record;
CREATE TRIGGER audit AFTER UPDATE ON idem_outbox FOR EACH ROW EXECUTE FUNCTION note_row();
SELECT count(*) FROM idem_take('mail', 10);
DROP TRIGGER audit ON idem_outbox;
CREATE TRIGGER audit AFTER INSERT ON idem_record FOR EACH STATEMENT EXECUTE FUNCTION note_row();
SELECT outcome FROM idem_claim('acme', 'pay', 't2');
DROP TRIGGER audit ON idem_record;
CREATE TRIGGER audit AFTER DELETE ON idem_record FOR EACH ROW EXECUTE FUNCTION note_row();
SELECT outcome FROM idem_claim('acme', 'pay', 't2');
SELECT idem_forget('acme', 'pay', 'globex');
DROP TRIGGER audit ON idem_record;
SELECT what FROM fired;

-- a foreign key of the table, a deferrable unique constraint
CREATE TABLE tenants (name text COLLATE "C" PRIMARY KEY);
ALTER TABLE idem_record ADD CONSTRAINT known_tenant
	FOREIGN KEY (tenant) REFERENCES tenants NOT VALID;
SELECT outcome FROM idem_claim('nobody', 'pay', 'f1');
ALTER TABLE idem_record DROP CONSTRAINT known_tenant;
ALTER TABLE idem_outbox ADD CONSTRAINT one_per_key
	UNIQUE (tenant, topic, key) DEFERRABLE INITIALLY DEFERRED;
SELECT outcome FROM idem_enqueue('acme', 'mail', 'm3', 'x'::bytea);
ALTER TABLE idem_outbox DROP CONSTRAINT one_per_key;
-- a foreign key that references the table: idem never changes a key, and
-- deletes through SQL, which checks it
CREATE TABLE receipts (tenant text COLLATE "C", endpoint text COLLATE "C", key text COLLATE "C",
	FOREIGN KEY (tenant, endpoint, key) REFERENCES idem_record (tenant, endpoint, key));
INSERT INTO receipts VALUES ('acme', 'pay', 't2');
SELECT idem_complete('acme', 'pay', 't2', 200, 'ok');
SELECT idem_forget('acme', 'pay', 't2');
DROP TABLE receipts, tenants, fired;
DROP FUNCTION note_row();

DROP EXTENSION idem;
