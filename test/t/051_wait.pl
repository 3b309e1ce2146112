# test/t/051_wait.pl: a claim with wait => true waits for a committed
# pending claim of its key (the external-call pattern), and answers what it
# left: woken by a complete, a fail, a retryable fail, a release (each only
# once the finisher commits), or by the lease running out; bounded by its
# wait_timeout, lock_timeout (55P03, as a lock wait), statement_timeout
# (57014) and a cancel.  With idem preloaded it
# sleeps on a condition variable; without, it polls.  (pg_isolation_regress
# cannot drive these: it sees only lock waits as blocked.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);

# Start a waiting claim in a psql of its own; returns its handle
sub start_waiter
{
	my ($node, $sql) = @_;
	my %w = (out => '', err => '', started => time());
	$w{run} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		  '-h', $node->host, '-p', $node->port,
		  '-d', 'postgres', '-c', $sql ],
		'>', \$w{out}, '2>', \$w{err});
	return \%w;
}

# Wait until the waiter sleeps in idem (wait event Extension); its pid
sub sleeping_pid
{
	my ($node) = @_;
	$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
		WHERE wait_event_type = 'Extension' AND query LIKE '%wait => true%'})
	  or die 'the waiter never slept';
	return $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity
		WHERE wait_event_type = 'Extension' AND query LIKE '%wait => true%'});
}

# The waiter's answer (stdout, stderr) and how long it took, in seconds
sub finish_waiter
{
	my ($w) = @_;
	$w->{run}->finish;
	chomp(my $out = $w->{out});
	return ($out, $w->{err}, time() - $w->{started});
}

my $claim_wait = q{SELECT outcome, status, convert_from(body, 'UTF8'), headers, attempt
	FROM idem_claim('t', 'e', 'k', 'req', wait => true)};

sub fresh_claim
{
	my ($node, $lease) = @_;
	$node->safe_psql('postgres', qq{TRUNCATE idem_record;
		SELECT idem_claim('t', 'e', 'k', 'req', lease => '$lease')});
}

# Each way a committed pending claim can be finished wakes the waiter, only
# once the finishing transaction commits: until then a preloaded waiter
# sleeps (Extension), a polling one sleeps, or between two sleeps waits for
# the finisher's key lock (Lock) or looks at the record (no wait event: CPU)
sub woken_by
{
	my ($node, $finish, $expect, $name, $events) = @_;
	fresh_claim($node, '5 min');
	my $w = start_waiter($node, $claim_wait);
	sleeping_pid($node);
	my $owner = $node->background_psql('postgres');
	$owner->query_safe('BEGIN');
	$owner->query_safe($finish);
	usleep(300_000);
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND state = 'active'
		  AND coalesce(wait_event_type, 'CPU') IN ($events)
		  AND query LIKE '%wait => true%'}),
		'1', "$name: still waiting before the finisher commits");
	$owner->query_safe('COMMIT');
	$owner->quit;
	my ($out, $err, $took) = finish_waiter($w);
	is($out, $expect, "$name: the waiter answers what it left");
	cmp_ok($took, '<', 60, "$name: woken long before the lease ended");
}

sub usleep { Time::HiRes::usleep(@_) }

sub test_node
{
	my ($node, $how) = @_;
	my $events = $how eq 'preloaded' ? q{'Extension'} : q{'Extension', 'Lock', 'CPU'};

	woken_by($node, q{SELECT idem_complete('t', 'e', 'k', 201, 'charged', 1, '{"Location": "/pay/1"}')},
		'replay|201|charged|{"Location": "/pay/1"}|1', "$how, complete", $events);
	woken_by($node, q{SELECT idem_fail('t', 'e', 'k', 402, 'declined')},
		'replay|402|declined||1', "$how, fail", $events);
	woken_by($node, q{SELECT idem_fail('t', 'e', 'k', 503, 'down', retryable => true)},
		'claimed||||2', "$how, retryable fail", $events);
	woken_by($node, q{SELECT idem_release('t', 'e', 'k', attempt => 1)},
		'claimed||||2', "$how, release", $events);

	# the lease runs out: unknown
	fresh_claim($node, '2 s');
	my $w = start_waiter($node, $claim_wait);
	my ($out, $err, $took) = finish_waiter($w);
	is($out, 'unknown||||1', "$how, lease runs out: unknown");
	cmp_ok($took, '<', 30, "$how, lease runs out: answered when it ran out");

	# wait_timeout passes first: in_progress
	fresh_claim($node, '5 min');
	$w = start_waiter($node, q{SELECT outcome, attempt
		FROM idem_claim('t', 'e', 'k', 'req', wait => true, wait_timeout => '1 s')});
	($out, $err, $took) = finish_waiter($w);
	is($out, 'in_progress|1', "$how, wait_timeout passes: in_progress");
	cmp_ok($took, '>=', 0.9, "$how, wait_timeout passes: after waiting it");
	cmp_ok($took, '<', 30, "$how, wait_timeout passes: not much longer");

	# the waiter holds a row the owner needs to finish the claim, and waits
	# first; the owner then queues for the row: a cycle the lock manager
	# cannot see.  The waiter fails as in a deadlock within about
	# deadlock_timeout (1 s), and the owner finishes
	fresh_claim($node, '8 s');
	$node->safe_psql('postgres', q{CREATE TABLE IF NOT EXISTS biz (id int PRIMARY KEY, v int);
		TRUNCATE biz; INSERT INTO biz VALUES (1, 0)});
	$w = start_waiter($node, qq{BEGIN; UPDATE biz SET v = v + 1 WHERE id = 1; $claim_wait; COMMIT});
	sleeping_pid($node);
	my $owner = $node->background_psql('postgres');
	my $started = time();
	$owner->query_safe(q{BEGIN; UPDATE biz SET v = v + 10 WHERE id = 1;
		SELECT idem_complete('t', 'e', 'k', 201, 'charged'); COMMIT});
	my $owner_took = time() - $started;
	$owner->quit;
	($out, $err, $took) = finish_waiter($w);
	like($err, qr/ERROR:  40P01: deadlock detected\nDETAIL:  Process \d+ waits for the committed pending claim of idem key "k"/,
		"$how, a waiter holding the owner's row: a deadlock's error");
	cmp_ok($owner_took, '<', 4, "$how, a waiter holding the owner's row: the owner finishes within seconds");
	is($node->safe_psql('postgres', q{SELECT v, state FROM biz, idem_record}), '10|succeeded',
		"$how, a waiter holding the owner's row: the owner's work and its completion are committed");

	# lock_timeout and statement_timeout end the wait long before the lease
	# does, with the errors a lock wait gets; the claim is left as it was
	for my $t (
		[ 'lock_timeout', qr/ERROR:  55P03: canceling statement due to lock timeout/ ],
		[ 'statement_timeout', qr/ERROR:  57014: canceling statement due to statement timeout/ ])
	{
		my ($setting, $error) = @$t;
		fresh_claim($node, '30 s');
		$w = start_waiter($node, qq{SET $setting = '500ms'; $claim_wait});
		($out, $err, $took) = finish_waiter($w);
		like($err, $error, "$how, $setting ends the wait");
		is($out, '', "$how, $setting: no answer");
		is($node->safe_psql('postgres', q{SELECT state, attempt, lease_expires_at > clock_timestamp()
			FROM idem_record}), 'pending|1|t', "$how, $setting: before the lease ended, nothing changed");
	}
}

# idem preloaded: condition variables
my $node = PostgreSQL::Test::Cluster->new('wait');
$node->init;
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');
test_node($node, 'preloaded');

# a cancel ends the wait with its error
fresh_claim($node, '5 min');
my $w = start_waiter($node, $claim_wait);
my $pid = sleeping_pid($node);
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
my ($out, $err, $took) = finish_waiter($w);
like($err, qr/canceling statement due to user request/, 'a cancel ends the wait');
cmp_ok($took, '<', 60, 'a cancel ends the wait at once');
is($node->safe_psql('postgres', q{SELECT state, attempt FROM idem_record}), 'pending|1',
	'a canceled wait changed nothing');

# a transaction never waits for its own claim
is($node->safe_psql('postgres', q{BEGIN;
	SELECT outcome FROM idem_claim('t', 'e', 'mine');
	SELECT outcome FROM idem_claim('t', 'e', 'mine', wait => true);
	COMMIT;}), "claimed\nin_progress", 'a transaction does not wait for its own claim');
$node->stop;

# not preloaded: the same answers, by polling
my $plain = PostgreSQL::Test::Cluster->new('wait_plain');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION idem');
test_node($plain, 'not preloaded');
$plain->stop;

done_testing();
