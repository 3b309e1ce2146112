# test/citus/041_citus.pl: idem distributed by Citus over a coordinator
# and two workers, on Unix sockets.  What doc/citus.md ("Scaling out with
# Citus") promises: idem_distribute() (and its errors), a non-superuser's
# claim + business write + complete in one transaction through the
# coordinator, delegation that survives adding a node and rebalancing,
# concurrent duplicates entering through every node (one claimed, the
# others in_progress without waiting), a retry storm through every node
# with a shard move in its middle, the purge on every node and
# idem_purge()'s cluster total, idem_stats per node and summed, and the
# tenant binding.
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
	$node->init(allows_streaming => 'logical');
	# Citus connects to its own node too (the rebalancer): on the socket
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
my @all = ($coord, $w1, $w2);

# run SQL as a role; returns (exit code, stdout, stderr) with SQLSTATEs
sub as_role
{
	my ($node, $role, $sql, $db) = @_;
	my ($out, $err);
	my $rc = $node->psql($db // 'postgres', "\\set VERBOSITY sqlstate\n$sql",
		stdout => \$out, stderr => \$err,
		extra_params => [ '-U', $role ]);
	return ($rc, $out, $err);
}

# Without Citus in the database, idem_distribute() says what is missing
$coord->safe_psql('postgres', 'CREATE DATABASE plain');
$coord->safe_psql('plain', 'CREATE EXTENSION idem');
my ($rc, $out, $err) = as_role($coord, 'postgres', 'SELECT idem_distribute()', 'plain');
like($err, qr/ERROR:  55000/, 'idem_distribute() without Citus: SQLSTATE 55000');
($rc, $out, $err) = $coord->psql('plain', 'SELECT * FROM idem_stats_nodes()');
like($err, qr/extension "citus" is not installed/, 'idem_stats_nodes() without Citus: says so');

# The cluster: the coordinator and worker1 first; worker2 comes later
$coord->safe_psql('postgres', sprintf(q{
	SELECT citus_set_coordinator_host('%s', %d);
	SELECT citus_add_node('%s', %d);
	CREATE EXTENSION idem;
	CREATE ROLE app LOGIN;
}, $coord->host, $coord->port, $w1->host, $w1->port));

($rc, $out, $err) = as_role($coord, 'app', 'SELECT idem_distribute()');
like($err, qr/ERROR:  42501/, 'idem_distribute() as a non-superuser: SQLSTATE 42501');
($rc, $out, $err) = $w1->psql('postgres', 'SELECT idem_distribute()');
like($err, qr/must run on the Citus coordinator/, 'idem_distribute() on a worker: refused');

# a record from before distributing is kept (in its shard)
$coord->safe_psql('postgres', q{
	SELECT idem_claim('early', 'POST /orders', 'k');
	SELECT idem_complete('early', 'POST /orders', 'k', 201, 'early order');
});
$coord->safe_psql('postgres', 'SELECT idem_distribute()');
$coord->safe_psql('postgres', 'SELECT idem_distribute()');
is($coord->safe_psql('postgres', q{
	SELECT outcome, status, convert_from(body, 'UTF8'), pg_relation_size('idem_record')
	  FROM idem_replay('early', 'POST /orders', 'k')}),
	'replay|201|early order|0',
	'a record from before idem_distribute() replays from its shard; the local table is emptied');
is($coord->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail',
						'idem_replay', 'idem_release', 'idem_forget', 'idem_list',
						'idem_claim_many', 'idem_complete_many', 'idem_fail_many')),
		   count(*) FILTER (WHERE o.distribution_argument_index = 0
							  AND o.force_delegation
							  AND o.colocationid = (SELECT colocationid FROM pg_dist_partition
												 WHERE logicalrelid = 'idem_record'::regclass))
	  FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid}),
	'20|20', 'idem_distribute(), twice: every per-key function delegated by tenant, co-located with idem_record');

# the outbox stays a table of the coordinator (0.3.0), and works there as
# on one server: enqueue in a business transaction, take, deliver
is($coord->safe_psql('postgres', q{
	SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'idem_outbox'::regclass;
	BEGIN;
	SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
	SELECT outcome FROM idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
	COMMIT;
	SELECT key, attempt FROM idem_take('mail');
	SELECT idem_delivered(id, 1, 200) FROM idem_outbox WHERE key = 'm1';
	SELECT state, status FROM idem_message('acme', 'mail', 'm1')}),
	"0\nenqueued\nduplicate\nm1|1\n\ndelivered|200",
	'the outbox is a local table of the coordinator, left by idem_distribute(), and works there');

# the application's business table, co-located by tenant
$coord->safe_psql('postgres', q{
	CREATE TABLE orders (tenant text COLLATE "C" NOT NULL, key text NOT NULL,
						 note text);
	SELECT create_distributed_table('orders', 'tenant', colocate_with => 'idem_record');
	GRANT SELECT, INSERT ON orders TO app;
});

# the port of the node that holds a tenant's shard of idem_record
sub shard_port
{
	my ($tenant) = @_;
	return $coord->safe_psql('postgres', qq{
		SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
		 WHERE p.shardid = get_shard_id_for_distribution_column('idem_record', '$tenant')});
}

# One request as the application would send it, through a node: claim,
# write, complete, in one transaction
sub request
{
	my ($node, $tenant, $key) = @_;
	return as_role($node, 'app', qq{
BEGIN;
SELECT outcome FROM idem_claim('$tenant', 'POST /orders', '$key', 'request $key');
INSERT INTO orders VALUES ('$tenant', '$key', 'order $key');
SELECT idem_complete('$tenant', 'POST /orders', '$key', 201, 'order $key');
COMMIT;
SELECT outcome, convert_from(body, 'UTF8') FROM idem_claim('$tenant', 'POST /orders', '$key', 'request $key');
});
}

($rc, $out, $err) = request($coord, 'acme', 'first');
is($rc, 0, 'a non-superuser claims, writes and completes in one transaction through the coordinator')
  or diag($err);
like($out, qr/^claimed\n.*replay\|order first$/s, 'then replays its response');

# from PL/pgSQL, the FROM form of a call is delegated too
($rc, $out, $err) = as_role($coord, 'app', q{
BEGIN;
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'plpgsql', 'request');
INSERT INTO orders VALUES ('acme', 'plpgsql', 'order plpgsql');
DO $$BEGIN PERFORM * FROM idem_complete('acme', 'POST /orders', 'plpgsql', 201, 'order plpgsql'); END$$;
COMMIT;
SELECT outcome FROM idem_replay('acme', 'POST /orders', 'plpgsql');
});
is($out, "claimed\nreplay", 'PERFORM * FROM idem_complete(...) in PL/pgSQL, in the same transaction')
  or diag($err);

# a node added, shards rebalanced: still one transaction per request, for
# tenants on either worker
$coord->safe_psql('postgres', sprintf(q{
	SELECT citus_add_node('%s', %d);
	SELECT rebalance_table_shards(shard_transfer_mode => 'force_logical');
}, $w2->host, $w2->port));
is($coord->safe_psql('postgres', q{
	SELECT count(DISTINCT p.groupid) FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid)
	 WHERE s.logicalrelid = 'idem_record'::regclass}),
	'2', 'rebalanced: idem_record has shards on both workers');
my @tenants = map { "t$_" } 1 .. 8;
my $ok = 0;
for my $t (@tenants)
{
	($rc, $out, $err) = request($coord, $t, 'after-rebalance');
	$ok++ if $rc == 0 && $out =~ /replay\|order after-rebalance$/;
	diag($err) if $rc;
}
is($ok, 8, 'after adding a node and rebalancing, requests of every tenant go through');
is(scalar(keys %{ { map { shard_port($_) => 1 } @tenants } }), 2,
	'those tenants live on both workers');

# Concurrent duplicates, one through each node: one claimed, the others
# in_progress at once, while the claim's transaction is still open
my $dup = $coord->basedir . '/duplicate.sql';
open(my $fh, '>', $dup) or die;
print $fh q{BEGIN;
SELECT clock_timestamp() AS t0 \gset
SELECT outcome FROM idem_claim('dup', 'POST /orders', 'same', 'request');
SELECT extract(epoch FROM clock_timestamp() - :'t0') < 2 AS quick;
SELECT pg_sleep(4);
COMMIT;
};
close($fh);
my @runs;
for my $node (@all)
{
	my %r = (out => '', err => '');
	$r{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-U', 'app',
		  '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-f', $dup ],
		'>', \$r{out}, '2>', \$r{err});
	push @runs, \%r;
}
$_->{h}->finish for @runs;
my @outcomes = sort map { (split /\n/, $_->{out})[0] // 'error: ' . $_->{err} } @runs;
is("@outcomes", 'claimed in_progress in_progress',
	'duplicates through the coordinator and both workers: one claimed, two in_progress');
is(scalar(grep { $_->{out} =~ /^\w+\nt\n/ } @runs), 3, 'every duplicate answered without waiting')
  or diag(map { $_->{out} } @runs);

# A retry storm through every node, with a shard move in its middle: a
# fifth of the transactions roll back after claiming, half the claims
# wait.  Every key's effect happens at most once.  Citus delegates a call
# inside a transaction only if its tenant is a constant (pgbench writes it
# into the literal) and the select list is not one function call (a CASE,
# not a cast).
my $script = $coord->basedir . '/request.sql';
open($fh, '>', $script) or die;
print $fh q{\set t random(1, 8)
\set k random(1, 40)
\set r random(1, 5)
\set w random(0, 1)
BEGIN;
SELECT CASE outcome WHEN 'claimed' THEN 1 ELSE 0 END AS claimed FROM idem_claim('s:t', 'POST /orders', 'k' || :k, 'same request', wait => :w = 1) \gset
\if :claimed
INSERT INTO orders VALUES ('s:t', 'k' || :k, 'storm');
\if :r = 1
ROLLBACK;
\else
SELECT idem_complete('s:t', 'POST /orders', 'k' || :k, 201, 'order k' || :k);
COMMIT;
\endif
\else
COMMIT;
\endif
};
close($fh);
my @storm;
for my $node (@all)
{
	my %r = (out => '', err => '');
	$r{h} = IPC::Run::start(
		[ 'pgbench', '-n', '-h', $node->host, '-p', $node->port, '-U', 'app',
		  '-c', '3', '-j', '1', '-T', '12', '-f', $script, 'postgres' ],
		'>', \$r{out}, '2>', \$r{err});
	push @storm, \%r;
}
sleep 3;
my $from = shard_port('s1') == $w1->port ? $w1 : $w2;
my $to = $from == $w1 ? $w2 : $w1;
$coord->safe_psql('postgres', sprintf(q{
	SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idem_record', 's1'),
		'%s', %d, '%s', %d, shard_transfer_mode => 'force_logical')},
	$from->host, $from->port, $to->host, $to->port));
my $storm_running = grep { $_->{h}->pumpable } @storm;
$_->{h}->finish for @storm;
is(shard_port('s1'), $to->port, "tenant s1's shard moved during the storm");
cmp_ok($storm_running, '>', 0, 'the storm was still running when the move ended');
# A call that Citus delegated to the node the shard was just moved away
# from fails (and pgbench gives up on that client): an error, never a
# wrong outcome.  Any other error fails the test.
my $moved_away = 0;
for my $r (@storm)
{
	my @errors = grep { /ERROR/ } split /\n/, $r->{err};
	my @others = grep { !/cannot execute a distributed query from a query on a shard/ } @errors;
	$moved_away += @errors - @others;
	ok($r->{out} =~ /number of failed transactions: 0 / && !@others,
		'storm through one node: no client error but the move\'s')
	  or diag($r->{out}, $r->{err});
}
note("storm: $moved_away client(s) stopped by a call delegated to the shard's old node");
my ($effects, $max) = split /\|/, $coord->safe_psql('postgres', q{
	SELECT count(*), coalesce(max(n), 0)
	  FROM (SELECT tenant, key, count(*) AS n FROM orders
			 WHERE note = 'storm' GROUP BY tenant, key) o});
note("storm: $effects keys executed, each at most $max time(s)");
cmp_ok($effects, '>', 0, 'storm: requests executed');
is($max, 1, "storm: every key's effect happened at most once");
is($coord->safe_psql('postgres', q{
	SELECT count(*) FROM orders o
	  LEFT JOIN idem_record r
		ON r.tenant = o.tenant AND r.endpoint = 'POST /orders' AND r.key = o.key
	 WHERE o.note = 'storm'
	   AND (r.key IS NULL OR r.state <> 'succeeded' OR r.status <> 201
			OR r.body <> convert_to('order ' || o.key, 'UTF8'))}),
	'0', 'storm: every committed effect has its succeeded record');
is($coord->safe_psql('postgres', q{
	SELECT count(*) FROM idem_record r
	  LEFT JOIN orders o ON o.tenant = r.tenant AND o.key = r.key
	 WHERE r.tenant LIKE 's_' AND (r.state <> 'succeeded' OR o.key IS NULL)}),
	'0', 'storm: every record is a success with its effect');
my ($tenant, $key) = split /\|/, $coord->safe_psql('postgres', q{
	SELECT tenant, key FROM orders WHERE note = 'storm' AND tenant = 's1' LIMIT 1});
($rc, $out, $err) = as_role($coord, 'app', qq{
	SELECT outcome, status, convert_from(body, 'UTF8')
	  FROM idem_claim('$tenant', 'POST /orders', '$key', 'same request')});
is($out, "replay|201|order $key", "storm: the moved tenant's key replays its response");

# The purge.  Records of tenants on both workers are made to expire; a
# pending claim whose lease runs is kept even past its expiry.
sub expire
{
	my ($prefix) = @_;
	$coord->safe_psql('postgres', qq{
		SELECT idem_claim('$prefix' || t, 'POST /x', 'k' || k)
		  FROM generate_series(1, 8) t, generate_series(1, 5) k;
		SELECT idem_complete('$prefix' || t, 'POST /x', 'k' || k, 200, 'ok')
		  FROM generate_series(1, 8) t, generate_series(1, 5) k;
		UPDATE idem_record SET expires_at = now() - interval '1 minute',
							   lease_expires_at = now() - interval '1 minute'
		 WHERE tenant LIKE '$prefix%';
	});
}
$coord->safe_psql('postgres', q{
	SELECT idem_claim('leased', 'POST /x', 'k');
	UPDATE idem_record SET expires_at = now() - interval '1 minute' WHERE tenant = 'leased';
});
expire('p');
is($coord->safe_psql('postgres', 'SELECT idem_purge()'), '40',
	'idem_purge() on the coordinator purges every node and returns the total');
is($coord->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE tenant LIKE 'p%'), count(*) FILTER (WHERE tenant = 'leased')
	  FROM idem_record}),
	'0|1', 'the expired records are gone; a pending claim within its lease stays');
is($w1->safe_psql('postgres', 'SELECT idem_purge()'), '0',
	'idem_purge() on a worker purges its own placements: nothing left');

# idem_purge() on the coordinator under a hostile search_path: Citus's
# run_command_on_workers(), which it calls, names master_run_on_worker()
# without a schema, so idem pins the path around it
$coord->safe_psql('postgres', q{
	CREATE SCHEMA evil;
	CREATE TABLE evil.calls (what text);
	CREATE FUNCTION evil.master_run_on_worker(text[], integer[], text[], boolean,
		OUT node_name text, OUT node_port integer, OUT success boolean,
		OUT result text)
	RETURNS SETOF record LANGUAGE sql AS $$
		INSERT INTO evil.calls VALUES ('master_run_on_worker')
		RETURNING 'evil'::text, 0, true, '1000'::text
	$$;
});
$coord->psql('postgres', q{
	SET search_path = evil, pg_catalog, public;
	SELECT public.idem_purge();
}, stdout => \my $hostile_purge);
is($hostile_purge, '0', 'idem_purge() under a hostile search_path purges as before');
is($coord->safe_psql('postgres', q{SELECT count(*) FROM evil.calls}), '0',
	'and runs no function of the caller\'s search_path');
$coord->safe_psql('postgres', q{DROP SCHEMA evil CASCADE});

# every worker's background purge, of its own placements
expire('b');
for my $node ($w1, $w2)
{
	$node->safe_psql('postgres', q{
		ALTER SYSTEM SET idem.purge_interval = '1s'; SELECT pg_reload_conf()});
}
ok($coord->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM idem_record WHERE tenant LIKE 'b%'}),
	"the workers' background purges delete the expired records");
for my $node ($w1, $w2)
{
	$node->safe_psql('postgres', q{
		ALTER SYSTEM RESET idem.purge_interval; SELECT pg_reload_conf()});
}

# idem_stats of every node, and summed
is($coord->safe_psql('postgres', q{
	SELECT count(*), count(*) FILTER (WHERE purged > 0 AND claims_claimed > 0)
	  FROM idem_stats_nodes() s JOIN pg_dist_node n USING (nodeid)
	 WHERE n.groupid <> 0}),
	'2|2', 'idem_stats_nodes(): each worker claimed and purged');
is($coord->safe_psql('postgres', q{
	SELECT c.nodes = 3 AND c.claims_claimed = (SELECT sum(claims_claimed) FROM idem_stats_nodes())
		   AND c.purged >= 80
	  FROM idem_stats_cluster c}),
	't', 'idem_stats_cluster: the sum over the three nodes');

# The tenant binding holds wherever the call enters and wherever it runs
$coord->safe_psql('postgres', q{
	CREATE ROLE bound LOGIN;
	GRANT SELECT, INSERT ON orders TO bound;
	SELECT run_command_on_all_nodes($$SELECT idem_bind('bound', 'acme')$$);
});
for my $node (@all)
{
	($rc, $out, $err) = as_role($node, 'bound',
		q{SELECT outcome FROM idem_replay('acme', 'POST /orders', 'first')});
	is($out, 'replay', 'a bound role replays its own tenant through ' . $node->name);
	($rc, $out, $err) = as_role($node, 'bound',
		q{SELECT outcome FROM idem_replay('t1', 'POST /orders', 'after-rebalance')});
	like($err, qr/ERROR:  42501/, 'and is refused another tenant through ' . $node->name);
}

done_testing();
