--
-- pause.sql: idem_pause / idem_resume (0.4.0).  A paused topic's messages
-- (of one tenant, or of every tenant) are leased by no take until resumed;
-- enqueues still commit.  Not executable by PUBLIC; a bound role granted
-- them pauses and resumes its own tenant's messages only.
--
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT outcome FROM idem_enqueue('acme', 'mail', 'a1', 'x'::bytea);
SELECT outcome FROM idem_enqueue('globex', 'mail', 'g1', 'x'::bytea);
SELECT idem_pause('mail');
SELECT idem_pause('mail');
SELECT outcome FROM idem_enqueue('acme', 'mail', 'a2', 'x'::bytea);
SELECT count(*) FROM idem_take('mail', 10);
SELECT idem_resume('mail');
SELECT idem_resume('mail');
-- one tenant's messages only
SELECT idem_pause('mail', 'acme');
SELECT tenant, key FROM idem_take('mail', 10) ORDER BY key;
SELECT idem_resume('mail', 'acme');
SELECT tenant, key FROM idem_take('mail', 10) ORDER BY key;
SELECT topic, tenant FROM idem_pause;

-- privileges and the binding
CREATE ROLE pause_acme LOGIN;
SELECT idem_bind('pause_acme', 'acme');
SET ROLE pause_acme;
SELECT idem_pause('mail');
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_pause(text, text), idem_resume(text, text) TO pause_acme;
SET ROLE pause_acme;
SELECT idem_pause('mail', 'globex');
SELECT idem_pause('mail');
RESET ROLE;
SELECT topic, tenant FROM idem_pause;
SET ROLE pause_acme;
SELECT idem_resume('mail');
RESET ROLE;
SELECT count(*) FROM idem_pause;
REVOKE EXECUTE ON FUNCTION idem_pause(text, text), idem_resume(text, text) FROM pause_acme;
SELECT idem_unbind('pause_acme');
DROP ROLE pause_acme;

-- bad input
SELECT idem_pause(NULL);
SELECT idem_pause('');
SELECT idem_pause('mail', '');

DROP EXTENSION idem;
