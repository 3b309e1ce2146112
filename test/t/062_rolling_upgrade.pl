# test/t/062_rolling_upgrade.pl: a rolling upgrade from 0.2.0, the way a
# fleet runs it: the new package first, each database's ALTER EXTENSION
# idem UPDATE later.
#
# A database at 0.2.0 serves a client loop of claims, completes and replays
# throughout.  The server restarts (the new package installed: the library
# here is the current one), serves the 0.2.0 objects for 10 s, and is
# updated while the loop runs, then serves 10 s more.  No call errors but
# the restart's connection errors, every replay is byte for byte the same,
# every 0.2.0 function answers as before, and the purge worker purges the
# 0.2.0 database without logging an error.
use strict;
use warnings;
use File::Basename qw(dirname);
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('rolling');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1s'
});
$node->start;

my $version = slurp_file(dirname(__FILE__) . '/../../idem.control') =~ /^default_version = '(.*)'/m
	? $1 : die 'no default_version in idem.control';
$node->safe_psql('postgres', q{
	CREATE DATABASE app;
	CREATE ROLE app_acme;
});
$node->safe_psql('app', q{CREATE EXTENSION idem VERSION '0.2.0'});
is($node->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	'0.2.0', 'the database is at idem 0.2.0');

# Every 0.2.0 function, with what 0.2.0 answers; $s makes the keys new
sub check_api
{
	my ($s, $when) = @_;
	# a key's first attempt is above its bucket's fencing floor, which
	# the purges of other keys may have raised
	my %first = map {
		$_ => 1 + $node->safe_psql('app', qq{SELECT coalesce(max(attempt), 0) FROM idem_attempt_floor
			WHERE bucket = hashtext('$_-$s') & 4095})
	} qw(a f);
	my ($a1, $a2, $f2) = ($first{a}, $first{a} + 1, $first{f} + 1);
	is( $node->safe_psql('app', qq{
		SELECT outcome, attempt FROM idem_claim('acme', 'POST /api', 'a-$s', 'req'::bytea);
		SELECT idem_complete('acme', 'POST /api', 'a-$s', 201, '\\x00ff'::bytea, attempt => $a1);
		SELECT outcome, status, encode(body, 'hex') FROM idem_claim('acme', 'POST /api', 'a-$s', 'req'::bytea);
		SELECT outcome FROM idem_claim('acme', 'POST /api', 'a-$s', 'other'::bytea);
		SELECT outcome, status, encode(body, 'hex') FROM idem_replay('acme', 'POST /api', 'a-$s');
		SELECT outcome FROM idem_claim('acme', 'POST /api', 'f-$s', '{"b": 1, "a": 2}'::jsonb);
		SELECT idem_fail('acme', 'POST /api', 'f-$s', 503, 'later', retryable => true);
		SELECT outcome, attempt FROM idem_claim('acme', 'POST /api', 'f-$s', '{"a": 2, "b": 1}'::jsonb);
		SELECT idem_release('acme', 'POST /api', 'f-$s', attempt => $f2);
		SELECT string_agg(key || ':' || state || ':' || retryable, ' ' ORDER BY key)
		  FROM idem_list('acme', 'POST /api', max_rows => 1000) WHERE key LIKE '%-$s';
		SELECT idem_forget('acme', 'POST /api', 'a-$s');
		SELECT outcome, attempt FROM idem_claim('acme', 'POST /api', 'a-$s');
		SELECT idem_fail('acme', 'POST /api', 'a-$s', 402, 'no'::bytea);
		SELECT outcome, status, convert_from(body, 'UTF8') FROM idem_replay('acme', 'POST /api', 'a-$s');
		SELECT idem_bind('app_acme', 'acme');
		SET ROLE app_acme;
		SELECT outcome FROM idem_claim('acme', 'POST /api', 'b-$s');
		RESET ROLE;
		SELECT idem_purge() >= 0;
		SELECT claims_claimed > 0 FROM idem_stats WHERE datname = current_database();
	}), join("\n", "claimed|$a1", '', 'replay|201|00ff', 'mismatch', 'replay|201|00ff', 'claimed', '',
			"claimed|$f2", 't', "a-$s:succeeded:false f-$s:failed:true", 't', "claimed|$a2", '', 'replay|402|no',
			'', 'claimed', 't', 't'),
		"$when: claim, complete, fail, replay, release, list, forget, bind, purge and stats answer as 0.2.0 does");
	my ($ret, $out, $err) = $node->psql('app', qq{SET ROLE app_acme; SELECT idem_claim('globex', 'POST /api', 'b-$s')},
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"/, "$when: the binding holds");
	is($node->safe_psql('app', q{SELECT idem_unbind('app_acme')}), 't', "$when: idem_unbind");
}

# Records that expire in 2 s: the purge worker must delete them
sub purged_by_worker
{
	my ($s, $when) = @_;
	$node->safe_psql('app', qq{
		SET idem.retry_window = '1s';
		SET idem.retention = '2s';
		SELECT count(idem_claim('t', 'e', 'short-$s-' || i, lease => '1s')) FROM generate_series(1, 50) i;
	});
	ok( $node->poll_query_until('app', qq{SELECT count(*) = 0 FROM idem_record WHERE key LIKE 'short-$s-%'}),
		"$when: the purge worker purges expired records");
}

check_api('before', 'at 0.2.0');
purged_by_worker('before', 'at 0.2.0');

# the response every loop iteration replays, byte for byte
$node->safe_psql('app', q{
	SELECT idem_claim('acme', 'POST /fixed', 'fixed');
	SELECT idem_complete('acme', 'POST /fixed', 'fixed', 200, '\x00010203fffe7b7d'::bytea,
		headers => '{"Location": "/fixed"}');
});

#
# The client loop, in a process of its own: each iteration claims a new key,
# completes it, replays it, and replays the fixed key, in one psql session
# (a script with the key as a variable: no pipe that a failed connection
# would break).
# Each line of its log: the time, then "ok" or the error.
#
my $log = $node->basedir . '/loop.log';
my $stop = $node->basedir . '/loop.stop';
my $connstr = $node->connstr('app');
my $expected = join("\n", 'claimed', '', 'replay|201|\x00ff7b7d', 'replay|201|\x00ff7b7d',
	'replay|200|\x00010203fffe7b7d|{"Location": "/fixed"}');
my $script = $node->basedir . '/loop.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
SELECT outcome FROM idem_claim('acme', 'POST /loop', :'k', 'req');
SELECT idem_complete('acme', 'POST /loop', :'k', 201, '\x00ff7b7d'::bytea);
SELECT outcome, status, body FROM idem_replay('acme', 'POST /loop', :'k', 'req');
SELECT outcome, status, body FROM idem_claim('acme', 'POST /loop', :'k', 'req');
SELECT outcome, status, body, headers FROM idem_replay('acme', 'POST /fixed', 'fixed');
});
my $loop = fork();
die "fork: $!" unless defined $loop;
if ($loop == 0)
{
	# the child never runs the test's END blocks, which stop the node; it
	# ends when the parent does, even if the parent died before it wrote
	# the stop file (prove would wait for the child forever)
	my $parent = getppid();
	$SIG{__DIE__} = sub { print STDERR @_; POSIX::_exit(2); };
	open(my $fh, '>>', $log) or POSIX::_exit(1);
	$fh->autoflush(1);
	for (my $i = 1; !-e $stop && getppid() == $parent; $i++)
	{
		my ($out, $err) = ('', '');
		IPC::Run::run([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-v', "k=k$i",
				'-f', $script, '-d', $connstr ],
			'<', \undef, '>', \$out, '2>', \$err);
		chomp $out;
		my $result = $err ne '' ? $err : $out eq $expected ? 'ok' : "wrong answer: $out";
		$result =~ s/\n/ | /g;
		printf $fh "%.3f %s\n", time(), $result;
	}
	close($fh);
	POSIX::_exit(0);
}

# the loop's log lines since time $from: [time, result]
sub loop_lines
{
	my ($from) = @_;
	return () unless -e $log;
	return grep { $_->[0] >= $from }
	  map { /^(\S+) (.*)$/ ? [ $1, $2 ] : () } split /\n/, slurp_file($log);
}

# wait until the loop has answered $n times since $from
sub wait_for_answers
{
	my ($from, $n, $what) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		return pass($what) if grep({ $_->[1] eq 'ok' } loop_lines($from)) >= $n;
		sleep(0.2);
	}
	return fail($what);
}

my $t_start = time();
wait_for_answers($t_start, 5, 'the loop runs against 0.2.0');

# the new package is installed: the server restarts
my $t_restart = time();
$node->restart;
my $t_restarted = time();
wait_for_answers($t_restarted, 5, 'the loop runs again after the restart');
check_api('restarted', 'after the restart, at 0.2.0');
purged_by_worker('restarted', 'after the restart, at 0.2.0');
sleep(10);

# ALTER EXTENSION idem UPDATE while the loop runs
my $t_update = time();
$node->safe_psql('app', 'ALTER EXTENSION idem UPDATE');
my $t_updated = time();
is($node->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$version, 'the database is updated');
wait_for_answers($t_updated, 5, 'the loop runs on after the update');
check_api('updated', 'after the update');
purged_by_worker('updated', 'after the update');
sleep(10);

open(my $fh, '>', $stop) or die "$stop: $!";
close($fh);
waitpid($loop, 0);
is($?, 0, 'the loop ended');

# Every iteration answered "ok" but those that the restart's connection
# errors hit: those must have started before the restart was over.
my @lines = loop_lines($t_start);
my @ok = grep { $_->[1] eq 'ok' } @lines;
my @connection = grep {
	$_->[1] ne 'ok'
	  && $_->[1] =~ /terminating connection due to administrator command|server closed the connection|connection to server .* failed|the database system is (shutting down|starting up)|no connection to the server/
	  && $_->[0] >= $t_restart
	  && $_->[0] <= $t_restarted + 5
} @lines;
my @errors = grep { $_->[1] ne 'ok' } @lines;
note(sprintf('%d iterations: %d ok, %d connection errors of the restart', scalar(@lines),
		scalar(@ok), scalar(@connection)));
is(scalar(@errors) - scalar(@connection), 0, 'no idem error and no wrong answer, apart from the restart')
  or diag(join("\n", map { "$_->[0] $_->[1]" } grep { $_->[1] ne 'ok' } @lines));
cmp_ok(scalar(grep { $_->[0] >= $t_restarted && $_->[0] < $t_update } @ok), '>', 0,
	'answers on the 0.2.0 objects after the restart');
cmp_ok(scalar(grep { $_->[0] >= $t_update && $_->[0] <= $t_updated } @ok) +
	  scalar(grep { $_->[0] > $t_updated } @ok), '>', 0, 'answers after the update');

my $server_log = slurp_file($node->logfile);
# a purge worker that the restart's shutdown terminated exits with code 1
# too: it says so first ("terminating background worker ... due to
# administrator command"), and only another exit is a failure
my %terminated = map { $_ => 1 }
  $server_log =~ /\[(\d+)\] FATAL:  terminating background worker "idem purge" due to administrator command/g;
my @failed = grep { !$terminated{$_} }
  $server_log =~ /background worker "idem purge" \(PID (\d+)\) exited with exit code [^0]/g;
is(scalar(@failed), 0, 'no purge worker failed')
  or diag("purge workers that failed: @failed");
my @server_errors = grep { /ERROR:/ && !/permission denied for idem tenant "globex"/ } split /\n/, $server_log;
is(scalar(@server_errors), 0, 'the server logged no ERROR but the refused tenants')
  or diag(join("\n", @server_errors));

$node->stop;
done_testing();
