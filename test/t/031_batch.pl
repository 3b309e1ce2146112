# test/t/031_batch.pl: a batch consumer.  One transaction claims 100,000
# keys with the default max_locks_per_transaction: claims take no
# heavyweight lock per key, so it commits, and meanwhile another session's
# claims proceed normally (and see the batch's keys as in_progress).  Then
# the batch completes all of them in one transaction, and the keys replay.
# Then the same with the batch calls: one idem_claim_many of 1,000,000
# keys, during which another session claims, the batch's backend holds no
# lock per key and its memory stays bounded, and one idem_complete_many.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

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

# ---- one idem_claim_many of 1,000,000 keys ----
my $big = $node->background_psql('postgres');
my $pid = $big->query_safe(q{SELECT pg_backend_pid()});
$big->query_safe(q{BEGIN});
$big->query_until(qr/started/, q{
	\echo started
	CREATE TEMP TABLE answers AS
	SELECT a.key, a.outcome, a.attempt
	  FROM idem_claim_many('big', 'POST /import',
						   (SELECT array_agg('m' || g ORDER BY g)
							  FROM generate_series(1, 1000000) g)) a;
});

# once the batch has claimed its first key, others see it in_progress
# without waiting, and claim their own keys
$node->poll_query_until('postgres', q{
	SELECT outcome = 'in_progress' FROM idem_replay('big', 'POST /import', 'm1')})
  or die 'the batch claimed no key';
my $session_locks = $node->safe_psql('postgres',
	qq{SELECT count(*) FROM pg_locks WHERE pid = $pid});
is($node->safe_psql('postgres', q{
	SELECT string_agg(c.outcome, ',' ORDER BY g)
	  FROM generate_series(1, 3) g,
		   LATERAL idem_claim('other', 'POST /big', 'k' || g) c}),
	'claimed,claimed,claimed', 'another tenant claims during the batch');
is($node->safe_psql('postgres',
	q{SELECT outcome FROM idem_claim('big', 'POST /import', 'm1')}),
	'in_progress', 'a key of the running batch is in_progress, without waiting');

# the batch's memory, as its backend logs it, twice while it runs
my @totals;
for my $sample (1 .. 2)
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', qq{SELECT pg_log_backend_memory_contexts($pid)});
	my $total;
	for (1 .. 300)
	{
		last if ($total) = slurp_file($node->logfile, $offset) =~ /Grand total: (\d+) bytes/;
		usleep(100_000);
	}
	push @totals, $total // die 'the batch backend logged no memory contexts';
	sleep 2;
}
$big->query_safe(q{SELECT 1});
note("batch backend: $session_locks locks while claiming, memory "
	  . join(' and ', map { sprintf('%.1f MB', $_ / 1e6) } @totals));
# a lock per key would be thousands: max_locks_per_transaction is 64
cmp_ok($session_locks, '<', 64, 'the batch holds no lock per key');
# the input array itself and its aggregation take most of it
cmp_ok($_, '<', 200e6, 'the batch runs in bounded memory') for @totals;
cmp_ok($totals[1] - $totals[0], '<', 8e6,
	'its memory does not grow with the keys it claims');

is($big->query_safe(q{
	SELECT count(*), count(*) FILTER (WHERE outcome = 'claimed'),
		   bool_and(key = 'm' || ord)
	  FROM (SELECT key, outcome, row_number() OVER () AS ord FROM answers) a}),
	'1000000|1000000|t', 'one idem_claim_many claims 1,000,000 keys, one row per key in order');
$big->query_safe(q{COMMIT});
$big->query_safe(q{BEGIN});
is($big->query_safe(q{
	SELECT idem_complete_many('big', 'POST /import', array_agg(key ORDER BY key),
							  array_agg(201), NULL, array_agg(attempt ORDER BY key))
	  FROM answers}),
	'1000000', 'one idem_complete_many completes them');
$big->query_safe(q{COMMIT});
$big->quit;
is($node->safe_psql('postgres', q{
	SELECT count(*), count(*) FILTER (WHERE state = 'succeeded')
	  FROM idem_record WHERE tenant = 'big'}),
	'1000000|1000000', 'every record of the big batch is committed and succeeded');
is($node->safe_psql('postgres', q{
	SELECT string_agg(concat_ws(':', key, outcome, status), ' ')
	  FROM idem_claim_many('big', 'POST /import', ARRAY['m1', 'm999999', 'm1000001'])}),
	'm1:replay:201 m999999:replay:201 m1000001:claimed', 'its keys replay; a key beyond it is claimed');

$node->stop;
done_testing();
