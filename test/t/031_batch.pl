# test/t/031_batch.pl: a batch consumer.  One transaction claims 100,000
# keys with the default max_locks_per_transaction: claims take no
# heavyweight lock per key, so it commits, and meanwhile another session's
# claims proceed normally (and see the batch's keys as in_progress).  Then
# the batch completes all of them in one transaction, and the keys replay.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('batch');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idem});
# the default is 64 up to PostgreSQL 18 and 128 from 19
is($node->safe_psql('postgres', q{
	SELECT setting = boot_val FROM pg_settings
	 WHERE name = 'max_locks_per_transaction'}), 't',
	'max_locks_per_transaction has its default');

my $batch = $node->background_psql('postgres');
$batch->query_safe(q{BEGIN});
is($batch->query_safe(q{
	SELECT count(*) FILTER (WHERE c.outcome = 'claimed')
	  FROM generate_series(1, 100000) g,
		   LATERAL idem_claim('batch', 'POST /import', 'k' || g) c}),
	'100000', 'one transaction claims 100,000 keys');

is($node->safe_psql('postgres', q{
	SELECT string_agg(c.outcome, ',' ORDER BY g)
	  FROM generate_series(1, 3) g,
		   LATERAL idem_claim('other', 'POST /pay', 'k' || g) c}),
	'claimed,claimed,claimed', 'another tenant claims meanwhile');
is($node->safe_psql('postgres',
	q{SELECT outcome FROM idem_claim('batch', 'POST /import', 'k77777')}),
	'in_progress', 'a key of the open batch is in_progress for others');

$batch->query_safe(q{COMMIT});
$batch->query_safe(q{BEGIN});
is($batch->query_safe(q{
	SELECT count(*) FROM generate_series(1, 100000) g,
		   LATERAL idem_complete('batch', 'POST /import', 'k' || g, 201, 'done')}),
	'100000', 'one transaction completes 100,000 claims');
$batch->query_safe(q{COMMIT});
$batch->quit;

is($node->safe_psql('postgres', q{
	SELECT count(*), count(*) FILTER (WHERE state = 'succeeded')
	  FROM idem_record WHERE tenant = 'batch'}),
	'100000|100000', 'every record of the batch is committed and succeeded');
is($node->safe_psql('postgres',
	q{SELECT outcome, status FROM idem_claim('batch', 'POST /import', 'k12345')}),
	'replay|201', 'a batch key replays');

$node->stop;
done_testing();
