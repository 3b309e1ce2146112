# test/t/016_budget_storm.pl: one task's budget of 50, spent one unit at a
# time by 20 concurrent sessions until refused (issue 35).  Exactly 50
# spends succeed; every refused one carries IB001 and spends nothing; a
# spend that rolls back leaves the count where it was.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('budget_storm');
$node->init;
$node->append_conf('postgresql.conf', q{
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE TABLE spends (ok boolean NOT NULL, sqlstate text);
	SELECT idem_budget('acme', 'storm', 50);
});

# One attempt: spend a unit and note it, in one subtransaction; a refusal
# is noted with its SQLSTATE, and anything else fails the client.
my $script = $node->basedir . '/spend.sql';
open(my $fh, '>', $script) or die;
print $fh q{DO $$
BEGIN
	PERFORM idem_spend('acme', 'storm');
	INSERT INTO spends VALUES (true, NULL);
EXCEPTION WHEN SQLSTATE 'IB001' THEN
	INSERT INTO spends VALUES (false, SQLSTATE);
END $$;
};
close($fh);

my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-t', '5', '-c', '20', '-j', '2', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
ok($ok && $out =~ /number of failed transactions: 0 /,
	'20 sessions spent without a client error') or diag($out, $err);

is($node->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok) FROM spends}),
	'50|50', 'exactly 50 of 100 spends succeeded, 50 were refused');
is($node->safe_psql('postgres', q{SELECT DISTINCT sqlstate FROM spends WHERE NOT ok}),
	'IB001', 'every refused spend carried IB001');
is($node->safe_psql('postgres', q{SELECT spent, total FROM idem_budget WHERE task = 'storm'}),
	'50|50', 'the budget spent exactly its total');

# a rolled-back spend is not spent
$node->safe_psql('postgres', q{SELECT idem_budget('acme', 'other', 3)});
$node->safe_psql('postgres', q{BEGIN; SELECT idem_spend('acme', 'other', 2); ROLLBACK;});
is($node->safe_psql('postgres', q{SELECT spent FROM idem_budget WHERE task = 'other'}),
	'0', 'a spend that rolled back left the count unchanged');
is($node->safe_psql('postgres', q{SELECT idem_spend('acme', 'other', 3)}),
	'0', 'and the whole budget is still there');

$node->stop;
done_testing();
