# test/t/064_reindex_storm.pl: claims and enqueues go on while REINDEX
# INDEX CONCURRENTLY rebuilds idem_record_key and idem_outbox_key again and
# again, with no error at all: not a unique violation of the index being
# built (_ccnew) or retired (_ccold), nor "could not open relation" of an
# index OID kept across the reindex's drop (issue 30, item 10; 0.3.0 gave
# 23505 on idem_outbox_key_ccnew within seconds).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('reindex');
$node->init;
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $script = $node->basedir . '/claim.sql';
open my $fh, '>', $script or die "cannot write $script: $!";
print $fh q{\set k random(1, 100000)
SELECT outcome FROM idem_claim('t', 'e', 'k' || :k);
SELECT outcome FROM idem_enqueue('t', 'q', 'k' || :k, 'x'::bytea);
};
close $fh;

my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '4', '-T', '20', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
my $reindexes = 0;
while ($bench->pumpable && $reindexes < 200)
{
	for my $index ('idem_record_key', 'idem_outbox_key')
	{
		$node->safe_psql('postgres', "REINDEX INDEX CONCURRENTLY $index");
		$reindexes++;
	}
	$bench->pump_nb;
}
$bench->finish;
cmp_ok($reindexes, '>=', 10, "the indexes were rebuilt $reindexes times while the clients ran");
like($out, qr/number of transactions actually processed: [1-9]/, 'the clients ran');
unlike($err, qr/ERROR|aborted/, 'no claim or enqueue failed')
  or diag($err);
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname LIKE 'idem\_%\_cc%'}),
	'0', 'no index of a reindex is left behind');

$node->stop;
done_testing();
