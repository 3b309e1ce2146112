/* idem--0.2.0--0.3.0.sql: upgrade idem 0.2.0 to 0.3.0 */

\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit
