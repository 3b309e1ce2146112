# test/t/005_crash.pl: crashes.  A backend killed while it holds an
# uncommitted claim (the server restarts), and an immediate shutdown while
# claims run: committed records survive, uncommitted claims are gone and
# their keys claimable, committed pending claims keep their lease, and the
# worker comes back.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
restart_after_crash = on
idem.purge_interval = '1s'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE TABLE orders (key text NOT NULL);
	SELECT idem_claim('t', 'e', 'done');
	SELECT idem_complete('t', 'e', 'done', 201, '\x00c3a9'::bytea);
	SELECT idem_claim('t', 'e', 'pending', lease => '1 hour');
});
my $launcher = q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idem purge launcher'};
my $before = $node->safe_psql('postgres',
	q{SELECT key, state, encode(body, 'hex'), attempt, lease_expires_at FROM idem_record ORDER BY key});

# a backend holding an uncommitted claim is killed: the server crash-restarts
my $session = $node->background_psql('postgres');
$session->query_safe(q{BEGIN});
$session->query_safe(q{SELECT idem_claim('t', 'e', 'uncommitted')});
my $pid = $session->query_safe(q{SELECT pg_backend_pid()});
is($node->safe_psql('postgres', q{SELECT outcome FROM idem_claim('t', 'e', 'uncommitted')}),
	'in_progress', 'the uncommitted claim is in_progress for others');
my $log_offset = -s $node->logfile;
kill 'KILL', $pid;
ok($node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset),
	'killing the backend made the server restart');
$session->{run}->kill_kill;
ok($node->poll_query_until('postgres', 'SELECT true'), 'the server is back');

is($node->safe_psql('postgres',
	q{SELECT key, state, encode(body, 'hex'), attempt, lease_expires_at FROM idem_record ORDER BY key}),
	$before, 'committed records survive the crash as they were');
is($node->safe_psql('postgres', q{SELECT outcome, status, encode(body, 'hex') FROM idem_claim('t', 'e', 'done')}),
	'replay|201|00c3a9', 'a committed record replays');
is($node->safe_psql('postgres', q{SELECT outcome FROM idem_claim('t', 'e', 'pending')}),
	'in_progress', 'a committed pending claim keeps its lease');
is($node->safe_psql('postgres', q{SELECT outcome, attempt FROM idem_claim('t', 'e', 'uncommitted')}),
	'claimed|1', 'the uncommitted claim is gone and its key claimable');
ok($node->poll_query_until('postgres', $launcher), 'the purge launcher is back');

# an immediate shutdown in the middle of a storm of claims
my $script = $node->basedir . '/request.sql';
open(my $fh, '>', $script) or die;
print $fh q{\set k random(1, 2000)
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('storm', 'e', 'k' || :k) \gset
\if :claimed
INSERT INTO orders VALUES ('k' || :k);
SELECT idem_complete('storm', 'e', 'k' || :k, 201, 'order k' || :k);
\endif
COMMIT;
};
close($fh);
my ($out, $err) = ('', '');
my $storm = IPC::Run::start(
	[ 'pgbench', '-n', '-T', '30', '-c', '8', '-j', '2', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
$node->poll_query_until('postgres', q{SELECT count(*) >= 200 FROM orders})
  or die 'the storm did not start';
$node->stop('immediate');
$storm->finish;
unlike($err, qr/ERROR:(?! .*terminating connection)/, 'the storm met no error before the shutdown')
  or diag($err);
$node->start;

my $orders = $node->safe_psql('postgres', q{SELECT count(*) FROM orders});
note("orders committed before the immediate shutdown: $orders");
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM orders o
		 WHERE NOT EXISTS (SELECT 1 FROM idem_replay('storm', 'e', o.key) r
						    WHERE r.outcome = 'replay' AND r.body = convert_to('order ' || o.key, 'UTF8'))}),
	'0', 'every committed effect has its record, which replays');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM idem_record r WHERE tenant = 'storm'
		   AND (state <> 'succeeded' OR NOT EXISTS (SELECT 1 FROM orders o WHERE o.key = r.key))}),
	'0', 'no record without its committed effect: the claims in flight are gone');
is($node->safe_psql('postgres', q{SELECT max(n) FROM (SELECT count(*) AS n FROM orders GROUP BY key) c}),
	'1', 'no effect twice');
is($node->safe_psql('postgres', q{SELECT outcome FROM idem_claim('t', 'e', 'pending')}),
	'in_progress', 'the committed pending claim still holds its lease');
ok($node->poll_query_until('postgres', $launcher), 'the purge launcher is back');

$node->stop;
done_testing();
