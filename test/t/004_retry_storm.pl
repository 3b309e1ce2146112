# test/t/004_retry_storm.pl: a retry storm.  16 clients hammer 300 keys;
# a fifth of the transactions roll back after claiming, half the claims
# wait; under READ COMMITTED and under REPEATABLE READ (pgbench retries
# serialization failures).  Every key's effect happens at most once, and
# every committed effect has a record that replays its response.
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
max_connections = 40
lock_timeout = '20s'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE TABLE orders (key text NOT NULL, isolation text NOT NULL);
});

# One request: claim; if claimed, write the effect, then either roll back
# (a crash before commit) or complete and commit.
my $script = $node->basedir . '/request.sql';
open(my $fh, '>', $script) or die;
print $fh q{\set k random(1, 300)
\set r random(1, 5)
\set w random(0, 1)
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim(current_setting('transaction_isolation'), 'POST /orders', 'k' || :k, 'same request', wait => :w = 1) \gset
\if :claimed
INSERT INTO orders VALUES ('k' || :k, current_setting('transaction_isolation'));
\if :r = 1
ROLLBACK;
\else
SELECT idem_complete(current_setting('transaction_isolation'), 'POST /orders', 'k' || :k, 201, 'order k' || :k);
COMMIT;
\endif
\else
COMMIT;
\endif
};
close($fh);

for my $isolation ('read committed', 'repeatable read')
{
	my ($ok, $out, $err) = run_storm($isolation);
	ok($ok && $err !~ /aborted|error/i && $out =~ /number of failed transactions: 0 /,
		"$isolation: no client errors, no client aborted")
	  or diag($out, $err);
	my ($tx) = $out =~ /number of transactions actually processed: (\d+)/;
	my ($retried) = $out =~ /number of transactions retried: (\d+)/;
	note("$isolation: $tx transactions, " . ($retried // 0) . ' retried after serialization failures');

	my $stats = $node->safe_psql('postgres', qq{
		SELECT count(*), count(DISTINCT key), coalesce(max(n), 0)
		  FROM (SELECT key, count(*) AS n FROM orders
				 WHERE isolation = '$isolation' GROUP BY key) o});
	my ($effects, $keys, $max) = split(/\|/, $stats);
	note("$isolation: $effects keys executed, each at most $max time(s)");
	cmp_ok($keys, '>', 0, "$isolation: requests executed");
	is($max, 1, "$isolation: every key's effect happened at most once");

	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM orders o
			 WHERE isolation = '$isolation'
			   AND NOT EXISTS (SELECT 1 FROM idem_replay('$isolation', 'POST /orders', o.key) r
							    WHERE r.outcome = 'replay' AND r.status = 201
								  AND r.body = convert_to('order ' || o.key, 'UTF8'))}),
		'0', "$isolation: every committed effect replays its response");
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM idem_record r
			 WHERE tenant = '$isolation'
			   AND (state <> 'succeeded'
					OR NOT EXISTS (SELECT 1 FROM orders o
								    WHERE o.isolation = '$isolation' AND o.key = r.key))}),
		'0', "$isolation: every record is a committed effect; rolled-back claims left nothing");
}

sub run_storm
{
	my ($isolation) = @_;
	(my $escaped = $isolation) =~ s/ /\\ /g;
	local $ENV{PGOPTIONS} = "-c default_transaction_isolation=$escaped";
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'pgbench', '-n', '-T', '10', '-c', '16', '-j', '2',
		  '--max-tries', '1000', '-f', $script,
		  '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', \$out, '2>', \$err);
	return ($ok, $out, $err);
}

$node->stop;
done_testing();
