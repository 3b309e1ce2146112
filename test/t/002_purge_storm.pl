# test/t/002_purge_storm.pl: a claim storm while the worker purges a million
# expired records never waits for the purge.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('storm');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1h'
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# a million records that expired yesterday, in the storm's tenant and endpoint
$node->safe_psql('postgres', q{
	INSERT INTO idem_record (tenant, endpoint, key, state, status, body, attempt,
							 created_at, claimed_at, lease_expires_at, expires_at)
	SELECT 'storm', 'POST /x', 'old-' || i, 'succeeded', 200, 'old', 1,
		   now() - interval '2d', now() - interval '2d', now() - interval '2d',
		   now() - interval '1d'
	  FROM generate_series(1, 1000000) i;
	VACUUM ANALYZE idem_record;
	CREATE SEQUENCE storm_key;
});

my $script = $node->basedir . '/storm.sql';
open(my $fh, '>', $script) or die;
# each transaction a key of its own: two clients drawing the same key would
# see the second one's complete refused (55000, the first finished it)
print $fh q{SELECT nextval('storm_key') AS k \gset
BEGIN;
SELECT outcome FROM idem_claim('storm', 'POST /x', 'new-' || :k);
SELECT idem_complete('storm', 'POST /x', 'new-' || :k, 201, 'ok');
COMMIT;
};
close($fh);

my ($out, $err) = ('', '');
my $storm = IPC::Run::start(
	[ 'pgbench', '-n', '-T', '8', '-c', '16', '-j', '2', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);

# the purge starts while the storm runs
sleep(1);
$node->safe_psql('postgres', q{ALTER SYSTEM SET idem.purge_interval = '200ms'});
$node->reload;

my ($samples, $waits, $purging) = (0, 0, 0);
while ($storm->pumpable)
{
	my $row = $node->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM pg_stat_activity w
				 WHERE w.wait_event_type = 'Lock'
				   AND EXISTS (SELECT 1 FROM pg_stat_activity p
							   WHERE p.pid = ANY (pg_blocking_pids(w.pid))
								 AND p.backend_type = 'idem purge')),
			   (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem purge')
	});
	my ($w, $p) = split(/\|/, $row);
	$samples++;
	$waits += $w;
	$purging++ if $p > 0;
	$storm->pump_nb;
	select(undef, undef, undef, 0.05);
}
my $storm_ok = $storm->finish;

ok($storm_ok && $err !~ /aborted|error/i && $out =~ /number of failed transactions: 0 /,
	'the storm had no failed transaction and no aborted client')
  or diag($out, $err);
note("samples: $samples, with a purge worker running: $purging");
cmp_ok($purging, '>', 0, 'the purge ran during the storm');
is($waits, 0, 'no claim ever waited for the purge');

ok( $node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'old-%'}),
	'every expired record is purged');
my ($tps) = $out =~ /tps = ([\d.]+)/;
note("storm: $tps tps");
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM idem_record WHERE key LIKE 'new-%' AND state = 'succeeded'}),
	$node->safe_psql('postgres', q{SELECT count(*) FROM idem_record WHERE key LIKE 'new-%'}),
	'every claim of the storm completed');

$node->stop;
done_testing();
