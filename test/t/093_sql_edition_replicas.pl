# test/t/093_sql_edition_replicas.pl: the SQL edition (sql-edition/idem.sql,
# no library) decides only on the primary, as the C edition does
# (066_logical_replication.pl, 003_replica_dump.pl): on a streaming standby
# and on a logical-replication subscriber of idem_record, a claim errors
# 25006, also the claim of a finished key, which the primary replays from
# its worker's one read (sql-edition/edition.sql, idem_sql_claim) and which
# a replica would otherwise answer the same way.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

system('python3', 'sql-edition/generate.py') == 0
  or BAIL_OUT('sql-edition/generate.py failed');

my $primary = PostgreSQL::Test::Cluster->new('sqled_primary');
$primary->init(allows_streaming => 'logical');
$primary->start;
my $sub = PostgreSQL::Test::Cluster->new('sqled_subscriber');
$sub->init;
$sub->start;

# the database's owner, no superuser, installs the edition on both
for my $node ($primary, $sub)
{
	$node->safe_psql('postgres', q{
		CREATE ROLE app LOGIN;
		CREATE DATABASE appdb OWNER app;
	});
	$node->safe_psql('appdb', q{ALTER SCHEMA public OWNER TO app});
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-U', 'app',
		  '-h', $node->host, '-p', $node->port, '-d', 'appdb',
		  '-f', 'sql-edition/idem.sql' ],
		'>', \$out, '2>', \$err)
	  or BAIL_OUT("sql-edition/idem.sql: $err");
}

# a finished key, replayed on the primary
my $claim = q{SELECT outcome, status, encode(body, 'hex')
	FROM idem_claim('acme', 'POST /orders', 'done', '\x01'::bytea)};
$primary->safe_psql('appdb', q{
	SELECT idem_claim('acme', 'POST /orders', 'done', '\x01'::bytea);
	SELECT idem_complete('acme', 'POST /orders', 'done', 201, '\x7b7d'::bytea);
}, extra_params => [ '-U', 'app' ]);
is($primary->safe_psql('appdb', $claim, extra_params => [ '-U', 'app' ]),
	'replay|201|7b7d', 'the primary replays the finished key');

# a standby of the primary
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('sqled_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
for my $call ($claim,
	q{SELECT idem_claim('acme', 'POST /orders', 'new')},
	q{SELECT idem_complete('acme', 'POST /orders', 'done', 200, 'x')})
{
	my ($ret, $out, $err) = $standby->psql('appdb', $call,
		extra_params => [ '-U', 'app', '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  25006: cannot call idem_\w+\(\) during recovery/,
		"the standby refuses with 25006: $call");
}

# a subscriber of every table of the primary's database
$primary->safe_psql('appdb', q{CREATE PUBLICATION everything FOR ALL TABLES});
$sub->safe_psql('appdb', "CREATE SUBSCRIPTION everything CONNECTION '"
	  . $primary->connstr . " dbname=appdb' PUBLICATION everything");
$sub->wait_for_subscription_sync($primary, 'everything', 'appdb');
is($sub->safe_psql('appdb', q{SELECT state, status FROM idem_record WHERE key = 'done'}),
	'succeeded|201', 'the finished record replicates to the subscriber');
for my $call ($claim, q{SELECT idem_claim('acme', 'POST /orders', 'new')})
{
	my ($ret, $out, $err) = $sub->psql('appdb', $call,
		extra_params => [ '-U', 'app', '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  25006: cannot call idem_claim\(\) on a logical replication subscriber of table "idem_record"/,
		"the subscriber refuses with 25006: $call");
}

# and on the primary, in a read-only transaction, as PostgreSQL refuses a write
my ($ret, $out, $err) = $primary->psql('appdb',
	"SET default_transaction_read_only = on; $claim",
	extra_params => [ '-U', 'app', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  25006: cannot execute idem_claim\(\) in a read-only transaction/,
	'a read-only transaction refuses the claim of a finished key with 25006');

done_testing();
