# test/citus/042_sqlway_waits.pl: the waits of the SQL way (record_sql.c),
# which only a table that Citus distributes takes, over a coordinator and
# two workers on Unix sockets.  Issue 21's rules, as on the direct way: a
# claim without wait never waits for a transaction that holds the key's
# record (a DELETE or UPDATE by hand on the shard, idem_forget left open);
# with wait => true it waits, and then decides over what that transaction
# left, with a lease that counts from after the wait; a finish whose record
# was deleted while it waited reports 55000, never XX000 "lost a locked
# record".
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my %nodes;
for my $name ('coordinator', 'worker1', 'worker2')
{
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		"citus.local_hostname = '" . $node->host . "'");
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus,idem'
max_connections = 100
max_worker_processes = 24
lock_timeout = '20s'
citus.shard_count = 8
citus.node_conninfo = 'sslmode=prefer'
citus.enable_statistics_collection = off
idem.purge_interval = '1h'
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
	$nodes{$name} = $node;
}
my ($coord, $w1, $w2) = @nodes{ 'coordinator', 'worker1', 'worker2' };
$coord->safe_psql('postgres', sprintf(q{
	SELECT citus_set_coordinator_host('%s', %d);
	SELECT citus_add_node('%s', %d);
	SELECT citus_add_node('%s', %d);
	CREATE EXTENSION idem;
	SELECT idem_distribute();
}, $coord->host, $coord->port, $w1->host, $w1->port, $w2->host, $w2->port));

my $tenant = 'acme';
my $endpoint = 'POST /orders';

# the worker that holds the tenant's shard of idem_record, and the shard
my ($port, $shard) = split /\|/, $coord->safe_psql('postgres', qq{
	SELECT n.nodeport, shard_name('idem_record', p.shardid)
	  FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
	 WHERE p.shardid = get_shard_id_for_distribution_column('idem_record', '$tenant')});
my $worker = $port == $w1->port ? $w1 : $w2;

# A record of key, claimed through the coordinator (attempt 1), completed
# unless pending is given, and made to expire unless live is given
sub record
{
	my ($key, %opt) = @_;
	my $sql = qq{SELECT idem_claim('$tenant', '$endpoint', '$key');};
	$sql .= qq{SELECT idem_complete('$tenant', '$endpoint', '$key', 201, 'done');}
	  unless $opt{pending};
	$sql .= qq{UPDATE idem_record SET expires_at = now() - interval '1 minute',
				lease_expires_at = now() - interval '1 minute'
			 WHERE tenant = '$tenant' AND key = '$key';}
	  unless $opt{live};
	$coord->safe_psql('postgres', $sql);
}

# A session of node that runs sql in an open transaction, and stays there
# until end() ends it
sub hold
{
	my ($node, $sql) = @_;
	my %s = (in => '', out => '', err => '', node => $node);
	$s{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port,
		  '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-f', '-' ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	$s{in} .= "SET application_name = 'holder';\nBEGIN;\n$sql\n";
	$s{h}->pump while length $s{in};
	$node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE application_name = 'holder' AND state = 'idle in transaction'})
	  or die "the holding session did not get there: $s{err}";
	return \%s;
}

sub end
{
	my ($s, $how) = @_;
	$s->{in} .= "$how;\n\\q\n";
	$s->{h}->finish;
	is($s->{err}, '', "the holding session's $how went through");
}

# a DELETE or an UPDATE by hand of key's row in the tenant's shard
sub by_hand
{
	my ($verb, $key) = @_;
	my $what = $verb eq 'DELETE' ? "DELETE FROM $shard" :
	  "UPDATE $shard SET status = status";
	return hold($worker, qq{
		SET LOCAL citus.enable_manual_changes_to_shards = on;
		$what WHERE tenant = '$tenant' AND key = '$key';});
}

# A claim without wait through the coordinator: (outcome, seconds, stderr).
# statement_timeout makes a claim that waits fail, not hang.
sub claim_now
{
	my ($key) = @_;
	my ($out, $err);
	$coord->psql('postgres', qq{
		\\set VERBOSITY verbose
		SET statement_timeout = '10s';
		SELECT clock_timestamp() AS t0 \\gset
		SELECT outcome FROM idem_claim('$tenant', '$endpoint', '$key');
		SELECT round(extract(epoch FROM clock_timestamp() - :'t0'), 1);
	}, stdout => \$out, stderr => \$err);
	my ($outcome, $seconds) = split /\n/, $out // '';
	return ($outcome // '', $seconds // 99, $err // '');
}

# A claim with wait => true and a lease of 7 minutes through the
# coordinator, started in the background; it returns once the claim waits
# for a lock on the shard's worker
sub claim_waiting
{
	my ($key) = @_;
	my %c = (out => '', err => '');
	$c{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-h', $coord->host, '-p', $coord->port,
		  '-d', 'postgres', '-c', '\set VERBOSITY verbose',
		  '-c', "SET statement_timeout = '60s'",
		  '-c', qq{SELECT outcome, attempt FROM idem_claim('$tenant', '$endpoint',
					'$key', wait => true, lease => '7 min')} ],
		'>', \$c{out}, '2>', \$c{err});
	$worker->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND application_name <> 'holder'})
	  or die "the claim did not wait: $c{err}";
	return \%c;
}

# the claim's answer, once it ended, and whether the lease it wrote counts
# from after mark (a time taken while it waited)
sub claimed_after
{
	my ($c, $key, $mark) = @_;
	$c->{h}->finish;
	chomp(my $answer = $c->{out});
	return ($answer, $c->{err}, $coord->safe_psql('postgres', qq{
		SELECT claimed_at > '$mark', created_at = claimed_at,
			   lease_expires_at - claimed_at = interval '7 min',
			   expires_at >= lease_expires_at
		  FROM idem_record WHERE tenant = '$tenant' AND key = '$key'}));
}

# A DELETE by hand of an expired record, in an open transaction: a claim
# without wait answers in_progress at once; with wait it waits, and once
# the deletion commits it claims the key again as new, fenced above the
# attempt deleted, with a lease from after the wait
record('deleted');
my $holder = by_hand('DELETE', 'deleted');
my ($outcome, $seconds, $err) = claim_now('deleted');
is($outcome, 'in_progress', 'an expired record being deleted by hand: a claim without wait answers in_progress')
  or diag($err);
cmp_ok($seconds, '<', 2, 'at once, without waiting for the deleting transaction');
my $claim = claim_waiting('deleted');
my $mark = $worker->safe_psql('postgres', 'SELECT clock_timestamp()');
sleep 1;
end($holder, 'COMMIT');
my ($answer, $claim_err, $times) = claimed_after($claim, 'deleted', $mark);
is($answer, 'claimed|2', 'with wait, after the deletion commits: claimed, attempt 2 (above the floor)')
  or diag($claim_err);
unlike($claim_err, qr/XX000|lost a locked record/, 'no "lost a locked record" error');
is($times, 't|t|t|t', 'the lease and expiry count from after the wait');

# The same deletion rolled back: the claim re-claims the expired record
record('kept');
$holder = by_hand('DELETE', 'kept');
($outcome, $seconds, $err) = claim_now('kept');
is($outcome, 'in_progress', 'a deletion that will roll back: a claim without wait answers in_progress')
  or diag($err);
cmp_ok($seconds, '<', 2, 'at once');
$claim = claim_waiting('kept');
$mark = $worker->safe_psql('postgres', 'SELECT clock_timestamp()');
sleep 1;
end($holder, 'ROLLBACK');
($answer, $claim_err, $times) = claimed_after($claim, 'kept', $mark);
is($answer, 'claimed|2', 'with wait, after the deletion rolls back: the expired record claimed again, attempt 2')
  or diag($claim_err);
is($times, 't|t|t|t', 'the lease and expiry count from after the wait');

# An UPDATE by hand holds the row as a deletion does
record('updated');
$holder = by_hand('UPDATE', 'updated');
($outcome, $seconds, $err) = claim_now('updated');
is($outcome, 'in_progress', 'an expired record being updated by hand: a claim without wait answers in_progress')
  or diag($err);
cmp_ok($seconds, '<', 2, 'at once');
end($holder, 'ROLLBACK');

# idem_forget left open through the coordinator
record('forgotten');
$holder = hold($coord, qq{SELECT idem_forget('$tenant', '$endpoint', 'forgotten');});
($outcome, $seconds, $err) = claim_now('forgotten');
is($outcome, 'in_progress', 'an expired record that idem_forget is deleting: a claim without wait answers in_progress')
  or diag($err);
cmp_ok($seconds, '<', 2, 'at once');
$claim = claim_waiting('forgotten');
$mark = $worker->safe_psql('postgres', 'SELECT clock_timestamp()');
sleep 1;
end($holder, 'COMMIT');
($answer, $claim_err, $times) = claimed_after($claim, 'forgotten', $mark);
is($answer, 'claimed|2', 'with wait, after idem_forget commits: claimed, attempt 2')
  or diag($claim_err);
is($times, 't|t|t|t', 'the lease and expiry count from after the wait');

# A finish whose pending claim is deleted by hand while it waits: the key
# has no live record (55000), not an internal error
record('finished', pending => 1, live => 1);
$holder = by_hand('DELETE', 'finished');
my %fin = (out => '', err => '');
$fin{h} = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $coord->host, '-p', $coord->port,
	  '-d', 'postgres', '-c', '\set VERBOSITY verbose',
	  '-c', "SET statement_timeout = '60s'",
	  '-c', qq{SELECT idem_complete('$tenant', '$endpoint', 'finished', 201, 'late')} ],
	'>', \$fin{out}, '2>', \$fin{err});
$worker->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE wait_event_type = 'Lock' AND application_name <> 'holder'})
  or die "idem_complete did not wait: $fin{err}";
end($holder, 'COMMIT');
$fin{h}->finish;
like($fin{err}, qr/ERROR:  55000/,
	'idem_complete of a claim deleted while it waited: 55000, the key has no live record');
unlike($fin{err}, qr/XX000|lost a locked record/, 'not "lost a locked record"');

# The same deletion rolled back: the finish goes through after the wait
record('finished-kept', pending => 1, live => 1);
$holder = by_hand('DELETE', 'finished-kept');
%fin = (out => '', err => '');
$fin{h} = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $coord->host, '-p', $coord->port,
	  '-d', 'postgres', '-c', "SET statement_timeout = '60s'",
	  '-c', qq{SELECT idem_complete('$tenant', '$endpoint', 'finished-kept', 201, 'late')} ],
	'>', \$fin{out}, '2>', \$fin{err});
$worker->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE wait_event_type = 'Lock' AND application_name <> 'holder'})
  or die "idem_complete did not wait: $fin{err}";
$mark = $worker->safe_psql('postgres', 'SELECT clock_timestamp()');
sleep 1;
end($holder, 'ROLLBACK');
$fin{h}->finish;
is($fin{err}, '', 'idem_complete after the deletion rolled back: no error');
is($coord->safe_psql('postgres', qq{
	SELECT outcome, convert_from(body, 'UTF8')
	  FROM idem_replay('$tenant', '$endpoint', 'finished-kept')}),
	'replay|late', 'and the response is stored');
is($coord->safe_psql('postgres', qq{
	SELECT finished_at > '$mark' FROM idem_record
	 WHERE tenant = '$tenant' AND key = 'finished-kept'}),
	't', 'finished as of after the wait');

done_testing();
