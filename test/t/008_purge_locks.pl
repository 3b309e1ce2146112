# test/t/008_purge_locks.pl: the background purge under an operator's
# locks.  An operator's open transaction that forgot a key holds that key's
# bucket of the fencing floor: the purge leaves that bucket's records for
# later and purges the rest of the database at once, claims of the
# expired keys answer at once, and other databases are purged meanwhile.
# An open transaction that locks a database's whole table stops the purge
# of that database only.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('locks');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1s'
idem.purge_batch = 50
});
$node->start;
for my $db (qw(db1 db2))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idem');
}

# records that expired yesterday, committed at once
sub expired_records
{
	my ($db, $keys) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO idem_record (tenant, endpoint, key, state, status, body,
								 attempt, created_at, claimed_at,
								 lease_expires_at, expires_at)
		SELECT 't', 'e', k, 'succeeded', 200, 'old', 1, now() - interval '2d',
			   now() - interval '2d', now() - interval '2d', now() - interval '1d'
		  FROM ($keys) keys(k)
	});
}

# the operator's key, and five keys of its bucket of the floor
$node->safe_psql('db1', q{
	SELECT idem_claim('t', 'e', 'op');
	SELECT idem_complete('t', 'e', 'op', 201, 'kept');
	CREATE TABLE mates AS
	SELECT 'mate-' || i AS k FROM generate_series(1, 1000000) i
	 WHERE hashtext('mate-' || i) & 4095 = hashtext('op') & 4095
	 ORDER BY i LIMIT 5;
});
is($node->safe_psql('db1', 'SELECT count(*) FROM mates'), '5',
	'five keys share the floor bucket of the operator\'s key');

my $operator = $node->background_psql('db1');
$operator->set_query_timer_restart;
$operator->query_safe('BEGIN');
is($operator->query_safe(q{SELECT idem_forget('t', 'e', 'op')}), 't',
	'the operator forgets a key and keeps the transaction open');

# the mates come first in the purge's order: its first batch holds them
expired_records('db1', 'SELECT k FROM mates');
expired_records('db1', q{SELECT 'old-' || i FROM generate_series(1, 400) i});
ok( $node->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'old-%'}),
	'the purge deletes the expired records of other buckets meanwhile');
is($node->safe_psql('db1', q{SELECT count(*) FROM idem_record WHERE key LIKE 'mate-%'}),
	'5', 'and leaves those of the operator\'s bucket');

# a claim of an expired key answers at once (the timeout is only a bound)
my ($ret, $out, $err) = $node->psql('db1', q{
	SET statement_timeout = '30s';
	SELECT outcome FROM idem_claim('t', 'e', (SELECT min(k) FROM mates));
});
is($out, 'claimed', 'a claim of an expired key of that bucket answers at once')
  or diag($err);

expired_records('db2', q{SELECT 'db2-' || i FROM generate_series(1, 100) i});
ok( $node->poll_query_until('db2',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'db2-%'}),
	'another database is purged meanwhile');

$operator->query_safe('COMMIT');
ok( $node->poll_query_until('db1',
		q{SELECT count(*) = 1 FROM idem_record WHERE key LIKE 'mate-%'}),
	'once the operator committed, the rest of the bucket is purged');
is( $node->safe_psql('db1', q{
		SELECT a.attempt > 1, a.attempt > f.attempt
		  FROM idem_claim('t', 'e', 'op') a, idem_attempt_floor f
		 WHERE f.bucket = hashtext('op') & 4095}),
	't|t', 'a new claim of the forgotten key starts above its bucket\'s floor');

# an operator's open transaction holds the whole table in db1: that
# database's worker waits for it, the others' are purged meanwhile
$operator->query_safe('BEGIN');
$operator->query_safe('LOCK TABLE idem_record IN ACCESS EXCLUSIVE MODE');
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) > 0 FROM pg_stat_activity
		 WHERE backend_type = 'idem purge' AND datname = 'db1'
		   AND wait_event_type = 'Lock'}),
	'the worker of db1 waits for the table lock');
expired_records('db2', q{SELECT 'db2-again-' || i FROM generate_series(1, 100) i});
ok( $node->poll_query_until('db2',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'db2-again-%'}),
	'another database is purged meanwhile');
$operator->query_safe('COMMIT');
$operator->quit;

expired_records('db1', q{SELECT 'after-' || i FROM generate_series(1, 100) i});
ok( $node->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'after-%'}),
	'once the lock is gone, db1 is purged again');

$node->stop;
done_testing();
