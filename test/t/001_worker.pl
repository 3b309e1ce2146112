# test/t/001_worker.pl: the background purge and the standby rules (the
# retention rule at start and reload: 011_retention_rule.pl).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1s'
});
$primary->start;

# how many launchers run
sub launchers
{
	my ($n) = @_;
	return qq{SELECT count(*) = $n FROM pg_stat_activity
		WHERE backend_type = 'idem purge launcher'};
}
ok($primary->poll_query_until('postgres', launchers(1)),
	'the launcher runs, named in pg_stat_activity');

# records of two databases, created after the launcher started: short ones
# (pending, with a 1s lease: a claim within its lease is never purged)
# expire after 2s, long ones stay
sub make_records
{
	my ($node, $db, $prefix, $n) = @_;
	$node->safe_psql($db, qq{
		SET idem.retry_window = '1s';
		SET idem.retention = '2s';
		SELECT count(idem_claim('t', 'e', '$prefix-' || i, lease => '1s')) FROM generate_series(1, $n) i;
	});
	return time() + 2;
}

for my $db (qw(db1 db2))
{
	$primary->safe_psql('postgres', "CREATE DATABASE $db");
	$primary->safe_psql($db, 'CREATE EXTENSION idem');
	$primary->safe_psql($db,
		q{SELECT count(idem_claim('t', 'e', 'long-' || i)) FROM generate_series(1, 100) i});
}
my %expiry = map { $_ => make_records($primary, $_, 'short', 500) } qw(db1 db2);
for my $db (qw(db1 db2))
{
	my $gone = q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'short-%'};
	ok($primary->poll_query_until($db, $gone), "expired records are purged in $db");
	my $lag = time() - $expiry{$db};
	note(sprintf('%s: purged %.2fs after expiry', $db, $lag));
	# one interval, plus a visit and polling, with ample room for a loaded
	# machine: this guards against a purge that never comes, not a speed
	cmp_ok($lag, '<', 1 + 5, "$db: the purge lags expiry by about one interval");
	is($primary->safe_psql($db, q{SELECT count(*) FROM idem_record WHERE key LIKE 'long-%'}),
		'100', "unexpired records stay in $db");
}
is($primary->safe_psql('db1', q{SELECT purged, last_purge IS NOT NULL FROM idem_stats
	WHERE datname = 'db1'}), '500|t', 'idem_stats counts the purged rows');

# a purge worker never keeps DROP DATABASE out
my ($drop_ret, $drop_out, $drop_err) = $primary->psql('postgres', 'DROP DATABASE db2');
is($drop_ret, 0, 'DROP DATABASE of a purged database succeeds') or diag($drop_err);

# SIGTERM ends the launcher; the postmaster starts it again
my $pid = $primary->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem purge launcher'});
$primary->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $primary->poll_query_until('postgres',
		qq{SELECT count(*) = 1 FROM pg_stat_activity
		   WHERE backend_type = 'idem purge launcher' AND pid <> $pid}),
	'the launcher is back after SIGTERM');
make_records($primary, 'db1', 'after-restart', 10);
ok( $primary->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'after-restart-%'}),
	'and purges again');

# the same worker purges the outbox: delivered and dead messages once their
# expiry has passed, never a queued, leased or unknown one
$primary->safe_psql('db1', q{
	SET idem.retry_window = '1s';
	SET idem.outbox_retention = '2s';
	SELECT count(idem_enqueue('t', 'mail', 'm' || i, 'x'::bytea)) FROM generate_series(1, 20) i;
	SELECT count(idem_enqueue('t', 'mail', 'keep' || i, 'x'::bytea, not_before => now() + interval '1 h'))
	  FROM generate_series(1, 5) i;
});
$primary->safe_psql('db1', q{
	SET idem.retry_window = '1s';
	SET idem.outbox_retention = '2s';
	SELECT count(CASE WHEN t.key LIKE 'm1%' THEN idem_dead(t.id, t.attempt)
				 ELSE idem_delivered(t.id, t.attempt) END)
	  FROM idem_take('mail', 100, lease => '1 h') t;
});
ok( $primary->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_outbox WHERE state IN ('delivered', 'dead')}),
	'the worker purges delivered and dead outbox messages');
is($primary->safe_psql('db1', q{SELECT count(*) FROM idem_outbox WHERE state = 'queued'}),
	'5', 'and leaves the queued ones');

# a reload changes the interval: at 1h nothing is purged, back at 1s the
# launcher wakes and purges
$primary->safe_psql('postgres', q{ALTER SYSTEM SET idem.purge_interval = '1h'});
$primary->reload;
sleep(1);
make_records($primary, 'db1', 'reload', 10);
sleep(3);
is($primary->safe_psql('db1', q{SELECT count(*) FROM idem_record WHERE key LIKE 'reload-%'}),
	'10', 'with a 1h interval, expired records wait');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET idem.purge_interval = '1s'});
$primary->reload;
ok( $primary->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'reload-%'}),
	'after a reload to 1s they are purged');

# idem.purge_pause paces the worker: after each batch it pauses (wait event
# IdemPurgePause, of type Extension) in proportion to the batch's time, and
# a reload changes that
$primary->safe_psql('postgres', q{
	ALTER SYSTEM SET idem.purge_batch = 100;
	ALTER SYSTEM SET idem.purge_pause = 100;
});
$primary->reload;
make_records($primary, 'db1', 'paced', 3050);
ok( $primary->poll_query_until('db1',
		q{SELECT count(*) > 0 FROM pg_stat_activity
		  WHERE backend_type = 'idem purge' AND wait_event_type = 'Extension'
			AND (current_setting('server_version_num')::int < 170000
				 OR wait_event = 'IdemPurgePause')}),
	'with idem.purge_pause, the worker pauses between batches');
cmp_ok($primary->safe_psql('db1', q{SELECT count(*) FROM idem_record WHERE key LIKE 'paced-%'}),
	'>', 0, 'and has records left to purge meanwhile');
$primary->safe_psql('postgres', q{
	ALTER SYSTEM RESET idem.purge_batch;
	ALTER SYSTEM RESET idem.purge_pause;
});
$primary->reload;
ok( $primary->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'paced-%'}),
	'and purges them all at the default pace');

# a visit that ends without reporting (here: idem dropped) leaves no earlier
# visit's backlog behind, which sent the launcher round again at once,
# without end (it was never idle for a second again)
$primary->safe_psql('postgres', 'CREATE DATABASE db3');
$primary->safe_psql('db3', 'CREATE EXTENSION idem');
$primary->safe_psql('postgres', q{
	ALTER SYSTEM SET idem.purge_batch = 1;
	ALTER SYSTEM SET idem.purge_pause = 0;
});
$primary->reload;
make_records($primary, 'db3', 'backlog', 20000);
ok( $primary->poll_query_until('db3',
		q{SELECT purged > 0 AND count(*) > 0 FROM idem_stats, idem_record
		  WHERE datname = 'db3' GROUP BY purged}),
	'a purge of db3 leaves a backlog');
$primary->safe_psql('db3', 'DROP EXTENSION idem');
$primary->safe_psql('postgres', q{
	ALTER SYSTEM RESET idem.purge_batch;
	ALTER SYSTEM RESET idem.purge_pause;
	ALTER SYSTEM SET idem.purge_interval = '1h';
});
$primary->reload;
ok( $primary->poll_query_until('postgres',
		q{SELECT state = 'idle' AND state_change < now() - interval '1 s'
		  FROM pg_stat_activity WHERE backend_type = 'idem purge launcher'}),
	'once idem is dropped there, the launcher sleeps its interval');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET idem.purge_interval = '1s'});
$primary->reload;

# a standby: no launcher, no decisions; after promotion it purges
$primary->safe_psql('postgres', q{ALTER SYSTEM SET idem.purge_interval = '1h'});
$primary->reload;
$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->adjust_conf('postgresql.auto.conf', 'idem.purge_interval', q{'1s'});
$standby->start;
$primary->safe_psql('db1', q{SELECT idem_complete('t', 'e', 'long-1', 201, 'kept')});
make_records($primary, 'db1', 'failover', 20);
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres', launchers(0)), 't', 'no launcher on a standby');
my ($ret, $stdout, $stderr) = $standby->psql('db1', q{SELECT idem_claim('t', 'e', 'x')});
like($stderr, qr/cannot call idem_claim\(\) during recovery/, 'a standby refuses claims');
like($stderr, qr/need the primary/, 'and says to use the primary');

$primary->stop;
$standby->promote;
ok($standby->poll_query_until('postgres', launchers(1)),
	'the promoted standby starts the launcher');
ok( $standby->poll_query_until('db1',
		q{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'failover-%'}),
	'and purges what expired');
is( $standby->safe_psql('db1',
		q{SELECT outcome || ' ' || status || ' ' || convert_from(body, 'UTF8')
		  FROM idem_claim('t', 'e', 'long-1')}),
	'replay 201 kept', 'records committed on the primary replay on the promoted standby');

$standby->stop;
done_testing();
