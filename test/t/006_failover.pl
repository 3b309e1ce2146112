# test/t/006_failover.pl: failover to a synchronous standby.  Whatever the
# primary committed replays on the promoted standby, even when the primary
# dies without a clean shutdown, and the promoted server's worker purges.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1h'
synchronous_standby_names = 'standby'
synchronous_commit = on
});
$primary->start;
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->append_conf('postgresql.conf', q{cluster_name = 'standby'});
$standby->adjust_conf('postgresql.conf', 'idem.purge_interval', q{'1s'});
$standby->adjust_conf('postgresql.conf', 'synchronous_standby_names', q{''});
$standby->start;
ok( $primary->poll_query_until('postgres',
		q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'}),
	'the standby is synchronous');

$primary->safe_psql('postgres', 'CREATE EXTENSION idem');
# every commit returns only once the standby has it
$primary->safe_psql('postgres', q{
	SELECT count(idem_claim('t', 'e', 'k' || i, 'fp' || i)) FROM generate_series(1, 200) i;
	SELECT count(idem_complete('t', 'e', 'k' || i, 201, 'body ' || i)) FROM generate_series(1, 200) i;
	SELECT idem_claim('t', 'e', 'in-flight', lease => '1 hour');
	SET idem.retry_window = '1s';
	SET idem.retention = '2s';
	SELECT count(idem_claim('t', 'short', 'k' || i, lease => '1s')) FROM generate_series(1, 50) i;
});
my $records = q{SELECT key, state, status, encode(body, 'hex'), attempt FROM idem_record ORDER BY endpoint, key};
my $before = $primary->safe_psql('postgres', $records);

# the primary dies at once; the standby takes over
$primary->stop('immediate');
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'the standby is promoted');

is($standby->safe_psql('postgres', $records), $before, 'every committed record is on the promoted standby');
is( $standby->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(1, 200) i,
			   LATERAL idem_claim('t', 'e', 'k' || i, 'fp' || i) c
		 WHERE c.outcome = 'replay' AND c.body = convert_to('body ' || i, 'UTF8')}),
	'200', 'and replays its response');
is($standby->safe_psql('postgres', q{SELECT outcome FROM idem_claim('t', 'e', 'in-flight')}),
	'in_progress', 'a pending claim stays pending through the failover');
ok( $standby->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idem_record WHERE endpoint = 'short'}),
	'the promoted server purges expired records');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_record WHERE endpoint = 'e'}),
	'201', 'and only those');

$standby->stop;
done_testing();
