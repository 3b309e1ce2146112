/* idem--0.2.0--0.3.0.sql: upgrade idem 0.2.0 to 0.3.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit

/*
 * The tenant binding's cache invalidation and the fencing floor rest on
 * statement triggers, which a session with session_replication_role =
 * replica (a migration tool, a restore) did not fire: enabled ALWAYS, they
 * fire whatever a session sets.
 */
ALTER TABLE idem_binding ENABLE ALWAYS TRIGGER idem_binding_changed;
ALTER TABLE idem_record ENABLE ALWAYS TRIGGER idem_record_forgotten;
