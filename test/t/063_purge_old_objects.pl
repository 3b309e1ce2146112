# test/t/063_purge_old_objects.pl: the purge worker purges a database whose
# SQL objects are still those of an older release that the library serves
# (each install script from 0.2.0 on, before ALTER EXTENSION idem UPDATE),
# as it purges an up-to-date one, across a restart and without an error.
use strict;
use warnings;
use File::Basename qw(basename dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('purge_old');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1s'
});
$node->start;

# every release's install script but 0.1.0's (objects the library refuses)
my @versions = grep { $_ ne '0.1.0' }
  map { basename($_) =~ /^idem--([0-9.]+)\.sql$/ ? $1 : () }
  glob(dirname(__FILE__) . '/../../idem--*.sql');
for my $version (sort(@versions), 'current')
{
	(my $db = "v$version") =~ tr/./_/;
	$node->safe_psql('postgres', qq{CREATE DATABASE "$db"});
	$node->safe_psql($db, $version eq 'current' ? 'CREATE EXTENSION idem'
		: "CREATE EXTENSION idem VERSION '$version'");
	# pending, completed, failed and released records
	$node->safe_psql($db, q{
		SET idem.retry_window = '1s';
		SET idem.retention = '2s';
		SELECT count(idem_claim('t', 'e', 'k' || i, lease => '1s')) FROM generate_series(1, 50) i;
		SELECT count(idem_complete('t', 'e', 'k' || i, 200, 'ok')) FROM generate_series(1, 10) i;
		SELECT count(idem_fail('t', 'e', 'k' || i, 402, 'no')) FROM generate_series(11, 20) i;
		SELECT count(idem_release('t', 'e', 'k' || i)) FROM generate_series(21, 30) i;
	});
	ok($node->poll_query_until($db, q{SELECT count(*) = 0 FROM idem_record}),
		"$version: the purge worker purges the expired records of a database created while it runs");
	$node->safe_psql($db, q{
		SET idem.retry_window = '1s';
		SET idem.retention = '2s';
		SELECT count(idem_claim('t', 'e', 'k' || i, lease => '1s')) FROM generate_series(1, 50) i;
	});
	# the server restarts meanwhile (a new package's library)
	$node->restart;
	ok($node->poll_query_until($db, q{SELECT count(*) = 0 FROM idem_record}),
		"$version: the purge worker purges the expired records");
}
my $log = slurp_file($node->logfile);
unlike($log, qr/ERROR/, 'no purge worker logged an error');

$node->stop;
done_testing();
