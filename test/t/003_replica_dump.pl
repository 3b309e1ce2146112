# test/t/003_replica_dump.pl: the standby rules for idem_replay, and
# pg_dump / pg_restore keeping every record.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE DATABASE app;
});
$primary->safe_psql('app', q{
	CREATE EXTENSION idem;
	SELECT idem_claim('acme', 'POST /orders', 'done', '{"qty": 1}'::jsonb);
	SELECT idem_complete('acme', 'POST /orders', 'done', 201, '\x00ff7b7d'::bytea);
	SELECT idem_claim('acme', 'POST /orders', 'declined');
	SELECT idem_fail('acme', 'POST /orders', 'declined', 402, 'no');
	SELECT idem_claim('acme', 'POST /pay', 'pending', lease => '1 h');
	SELECT idem_claim('globex', 'POST /orders', 'retry');
	SELECT idem_fail('globex', 'POST /orders', 'retry', 503, 'later', retryable => true);
	SELECT count(idem_claim('bulk', 'POST /x', 'k' || i)) FROM generate_series(1, 1000) i;
	SELECT idem_enqueue('acme', 'mail', 'm1', 'x'::bytea);
});

# the standby: decisions need the primary; replay only when allowed
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

for my $call (
	q{SELECT idem_claim('acme', 'POST /orders', 'done')},
	q{SELECT idem_complete('acme', 'POST /pay', 'pending', 200, 'x')},
	q{SELECT idem_fail('acme', 'POST /pay', 'pending', 500, 'x')},
	q{SELECT idem_release('acme', 'POST /pay', 'pending')},
	q{SELECT idem_purge()},
	q{SELECT idem_enqueue('acme', 'mail', 'm2', 'x'::bytea)},
	q{SELECT * FROM idem_take('mail')},
	q{SELECT idem_delivered(id, 1) FROM idem_outbox},
	q{SELECT idem_retry(id, 1) FROM idem_outbox},
	q{SELECT idem_dead(id, 1) FROM idem_outbox},
	q{SELECT idem_requeue(id) FROM idem_outbox})
{
	my ($ret, $out, $err) = $standby->psql('app', $call);
	like($err, qr/ERROR:  cannot call idem_\w+\(\) during recovery/, "standby refuses: $call");
}
my ($ret, $out, $err) = $standby->psql('app', q{SELECT idem_claim('acme', 'POST /orders', 'done')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  25006/, 'with SQLSTATE 25006');
like($err, qr/HINT:  Idempotency decisions need the primary server/, 'and a hint to use the primary');

($ret, $out, $err) = $standby->psql('app', q{SELECT * FROM idem_replay('acme', 'POST /orders', 'done')});
like($err, qr/cannot call idem_replay\(\) during recovery/, 'idem_replay errors on a standby by default');
is( $standby->safe_psql('app', q{SET idem.standby_replay = on;
		SELECT outcome, status, encode(body, 'hex') FROM idem_replay('acme', 'POST /orders', 'done')}),
	'replay|201|00ff7b7d', 'with idem.standby_replay it replays');
is($standby->safe_psql('app', q{SELECT state, attempt FROM idem_message('acme', 'mail', 'm1')}),
	'queued|0', 'idem_message reads on a standby');
$standby->stop;

# pg_dump and pg_restore keep every record, byte for byte
my $records = q{SELECT tenant, endpoint, key, state, retryable, encode(fingerprint, 'hex'),
	status, encode(body, 'hex'), attempt, created_at, lease_expires_at, expires_at
	FROM idem_record ORDER BY 1, 2, 3};
my $before = $primary->safe_psql('app', $records);
my $dump = $primary->basedir . '/app.dump';
$primary->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $primary->connstr('app') ],
	'pg_dump of a database with idem');
$primary->safe_psql('postgres', 'CREATE DATABASE restored');
$primary->command_ok([ 'pg_restore', '-d', $primary->connstr('restored'), $dump ],
	'pg_restore into a new database');
is($primary->safe_psql('restored', $records), $before, 'every record is restored as it was');
is($primary->safe_psql('restored', q{SELECT state, attempt FROM idem_message('acme', 'mail', 'm1')}),
	'queued|0', 'the outbox is restored with its messages');
is($primary->safe_psql('restored', q{
	SELECT (SELECT id FROM idem_enqueue('acme', 'mail', 'm3', 'x'::bytea))
		> (SELECT id FROM idem_outbox WHERE key = 'm1')}),
	't', 'and its sequence: a new message gets a new id');

sub answers
{
	my ($db) = @_;
	return $primary->safe_psql($db, q{
		SELECT string_agg(outcome || ':' || coalesce(status::text, '-'), ' ' ORDER BY n)
		  FROM (VALUES (1, 'acme', 'POST /orders', 'done', '{"qty":1}'::jsonb),
					   (2, 'acme', 'POST /orders', 'declined', NULL),
					   (3, 'acme', 'POST /pay', 'pending', NULL),
					   (4, 'acme', 'POST /orders', 'done', '{"qty":2}'::jsonb)) AS v(n, t, e, k, fp),
			   LATERAL idem_claim(t, e, k, fp)});
}
is(answers('restored'), 'replay:201 replay:402 in_progress:- mismatch:-',
	'the restored database answers replay, in_progress and mismatch at once');
is( $primary->safe_psql('restored', q{SELECT outcome, attempt FROM idem_claim('globex', 'POST /orders', 'retry')}),
	'claimed|2', 'and a retryable failure executes again as the next attempt');

# the same with a data-only dump into a database where idem is installed
my $data = $primary->basedir . '/app-data.sql';
$primary->command_ok(
	[ 'pg_dump', '--data-only', '-f', $data, '-d', $primary->connstr('app') ],
	'pg_dump --data-only');
$primary->safe_psql('postgres', 'CREATE DATABASE restored_data');
$primary->safe_psql('restored_data', 'CREATE EXTENSION idem');
$primary->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $data, '-d', $primary->connstr('restored_data') ],
	'restoring the data-only dump');
is($primary->safe_psql('restored_data', $records), $before, 'every record is restored as it was');
is(answers('restored_data'), 'replay:201 replay:402 in_progress:- mismatch:-',
	'and answers at once');

$primary->stop;
done_testing();
