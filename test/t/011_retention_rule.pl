# test/t/011_retention_rule.pl: a configuration that breaks the retention
# rule (idem.retention must be longer than idem.retry_window) never stops
# the server: claims error (22023) and write nothing, a WARNING names both
# values at start and at every reload, and ALTER SYSTEM refuses to leave a
# breaking pair in the configuration files.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('rule');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1h'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# ALTER SYSTEM is checked against the value the files give the other setting
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	q{ALTER SYSTEM SET idem.retention = '30min'});
like($stderr, qr/idem\.retention \(1800s\) must be longer than idem\.retry_window \(3600s\)/,
	'ALTER SYSTEM refuses a retention shorter than the retry window');

($ret, $stdout, $stderr) = $node->psql('postgres',
	q{ALTER SYSTEM SET idem.retention = 'soon'});
like($stderr, qr/invalid value for parameter "idem\.retention"/,
	'an invalid value gets core\'s own error');

# two ALTER SYSTEM commands without a reload between them: the second one
# is checked against the first, not against the value still in force
$node->safe_psql('postgres', q{ALTER SYSTEM SET idem.retention = '2h'});
($ret, $stdout, $stderr) = $node->psql('postgres',
	q{ALTER SYSTEM SET idem.retry_window = '3h'});
isnt($ret, 0, 'ALTER SYSTEM refuses a retry window longer than the pending retention');
like($stderr, qr/idem\.retention \(7200s\) must be longer than idem\.retry_window \(10800s\)/,
	'and names both values');
$node->restart;
is($node->safe_psql('postgres', 'SHOW idem.retry_window'), '1h',
	'the server restarts with a pair that keeps the rule');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET idem.retention});
($ret, $stdout, $stderr) = $node->psql('postgres',
	q{ALTER SYSTEM SET idem.retry_window = '3h'});
is($ret, 0, 'after RESET the default retention (1d) allows a 3h retry window');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET ALL});

# a reload of a breaking postgresql.conf, which ALTER SYSTEM cannot see:
# the values go in force, the log warns, claims error and write nothing
my $log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', q{idem.retention = '30min'});
$node->reload;
ok( $node->wait_for_log(
		qr/WARNING:  idem\.retention \(1800s\) must be longer than idem\.retry_window \(3600s\)/,
		$log_offset),
	'a reload breaking the rule logs a WARNING naming both values');
ok($node->poll_query_until('postgres', q{SELECT current_setting('idem.retention') = '30min'}),
	'and the values are in force');
($ret, $stdout, $stderr) = $node->psql('postgres',
	q{SELECT idem_claim('t', 'e', 'k')}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr, qr/ERROR:  22023: idem\.retention \(1800s\) must be longer than idem\.retry_window \(3600s\)/,
	'a claim errors with 22023 naming both values');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_record'), '0',
	'and writes nothing');

# the server starts with a breaking pair, and says so
$log_offset = -s $node->logfile;
$node->restart;
ok($node->log_contains(
		qr/WARNING:  idem\.retention \(1800s\) must be longer than idem\.retry_window \(3600s\)/,
		$log_offset),
	'the server starts with a breaking pair and logs a WARNING naming both');
($ret, $stdout, $stderr) = $node->psql('postgres', q{SELECT idem_claim('t', 'e', 'k')});
like($stderr, qr/must be longer than idem\.retry_window/, 'claims still error');

# fixed by a reload: claims work again
$node->append_conf('postgresql.conf', q{idem.retention = '1d'});
$node->reload;
ok( $node->poll_query_until('postgres',
		q{SELECT outcome = 'claimed' FROM idem_claim('t', 'e', 'k')}),
	'after a reload that restores the rule, claims work');

$node->stop;
done_testing();
