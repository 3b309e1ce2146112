# test/t/066_logical_replication.pl: idem on a logical-replication
# subscriber.
#
# A subscriber that receives idem_record from a publication (FOR ALL TABLES
# here) decides nothing: claims, finishes, forget and purge error 25006 as
# on a standby, idem_replay follows idem.standby_replay, and its purge
# worker leaves the records (the publisher's purge replicates) without an
# error.  Its apply worker, which fires idem's ALWAYS triggers, keeps
# applying: a key claimed on both sides would otherwise stop it on a
# duplicate key.  A subscriber of business tables only is free.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1h'
});
$pub->start;

# the subscriber's purge worker visits every second, and says at DEBUG1
# that it skips a subscribed database
my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1s'
log_min_messages = debug1
});
$sub->start;

for my $node ($pub, $sub)
{
	$node->safe_psql('postgres', q{
		CREATE DATABASE app;
		CREATE DATABASE shop;
		CREATE ROLE app_acme;
	});
	for my $db (qw(app shop))
	{
		$node->safe_psql($db, q{
			CREATE EXTENSION idem;
			CREATE TABLE orders (id integer PRIMARY KEY, item text);
		});
	}
}

#
# (1) FOR ALL TABLES: idem's tables replicate
#
$pub->safe_psql('app', q{
	CREATE PUBLICATION everything FOR ALL TABLES;
	SELECT idem_claim('acme', 'POST /orders', 'done', '{"qty": 1}'::jsonb);
	SELECT idem_complete('acme', 'POST /orders', 'done', 201, '\x00ff7b7d'::bytea);
	SELECT idem_claim('acme', 'POST /pay', 'pending', lease => '1 h');
	SELECT idem_claim('acme', 'POST /orders', 'gone');
	SELECT idem_bind('app_acme', 'acme');
	INSERT INTO orders VALUES (1, 'book');
});
$sub->safe_psql('app', "CREATE SUBSCRIPTION everything CONNECTION '"
	  . $pub->connstr . " dbname=app' PUBLICATION everything");
$sub->wait_for_subscription_sync($pub, 'everything', 'app');

my $records = q{SELECT tenant, endpoint, key, state, encode(fingerprint, 'hex'), status,
		encode(body, 'hex'), attempt, created_at, lease_expires_at, expires_at
	  FROM idem_record ORDER BY 1, 2, 3};
is($sub->safe_psql('app', $records), $pub->safe_psql('app', $records),
	'the publisher\'s records replicate to the subscriber');

# Every decision errors on the subscriber, as on a standby.  The calls are
# committed when they succeed: a claim here of a key that the publisher
# claims later would stop the apply worker.
for my $call (
	q{SELECT idem_claim('acme', 'POST /orders', 'both')},
	q{SELECT * FROM idem_claim_many('acme', 'POST /orders', ARRAY['many'])},
	q{SELECT idem_complete('acme', 'POST /pay', 'pending', 200, 'x')},
	q{SELECT idem_complete_many('acme', 'POST /pay', ARRAY['pending'], ARRAY[200], ARRAY['x']::bytea[])},
	q{SELECT idem_fail('acme', 'POST /pay', 'pending', 500, 'x')},
	q{SELECT idem_release('acme', 'POST /pay', 'pending')},
	q{SELECT idem_forget('acme', 'POST /orders', 'done')},
	q{SELECT idem_purge()})
{
	my ($ret, $out, $err) = $sub->psql('app', $call,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  25006: cannot call idem_\w+\(\) on a logical replication subscriber of table "idem_record"/,
		"the subscriber refuses with 25006: $call");
	like($err, qr/HINT:  .*subscription "everything"/, "with a hint naming the subscription: $call");
}
# the outbox likewise: its messages are the publisher's, and a take here
# would deliver one that the publisher's dispatchers deliver too
$pub->safe_psql('app', q{SELECT idem_enqueue('acme', 'mail', 'ob1', 'x'::bytea)});
ok( $sub->poll_query_until('app', q{SELECT count(*) = 1 FROM idem_outbox WHERE key = 'ob1'}),
	'a message enqueued on the publisher replicates');
for my $call (
	q{SELECT idem_enqueue('acme', 'mail', 'ob2', 'x'::bytea)},
	q{SELECT * FROM idem_take('mail')},
	q{SELECT idem_delivered(id, 1) FROM idem_outbox WHERE key = 'ob1'},
	q{SELECT idem_retry(id, 1) FROM idem_outbox WHERE key = 'ob1'},
	q{SELECT idem_dead(id, 1) FROM idem_outbox WHERE key = 'ob1'},
	q{SELECT idem_requeue(id) FROM idem_outbox WHERE key = 'ob1'})
{
	my ($ret, $out, $err) = $sub->psql('app', $call,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  25006: cannot call idem_\w+\(\) on a logical replication subscriber of table "idem_outbox"/,
		"the subscriber refuses with 25006: $call");
}
is($sub->safe_psql('app', q{SELECT state, attempt FROM idem_message('acme', 'mail', 'ob1')}),
	'queued|0', 'idem_message reads on the subscriber; nothing changed');

my ($ret, $out, $err) = $sub->psql('app', q{SELECT * FROM idem_replay('acme', 'POST /orders', 'done')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  25006: cannot call idem_replay\(\) on a logical replication subscriber/,
	'idem_replay errors on the subscriber by default');
is( $sub->safe_psql('app', q{SET idem.standby_replay = on;
		SELECT outcome, status, encode(body, 'hex') FROM idem_replay('acme', 'POST /orders', 'done', '{"qty": 1}'::jsonb);
		SELECT outcome FROM idem_replay('acme', 'POST /pay', 'pending');
		SELECT count(*) FROM idem_replay('acme', 'POST /orders', 'never')}),
	"replay|201|00ff7b7d\nin_progress\n0",
	'with idem.standby_replay it answers what the publisher decided');
is($sub->safe_psql('app', $records), $pub->safe_psql('app', $records),
	'the refused calls wrote nothing on the subscriber');

# The subscription keeps applying, idem's ALWAYS triggers included: a key
# the subscriber was asked to claim, a finish, a forget (the floor's
# trigger), new and truncated bindings (the bindings' trigger) and a
# business row.
$pub->safe_psql('app', q{
	SELECT idem_claim('acme', 'POST /orders', 'both');
	SELECT idem_complete('acme', 'POST /orders', 'both', 200, 'ok');
	SELECT idem_claim('acme', 'POST /orders', 'many');
	SELECT idem_complete('acme', 'POST /pay', 'pending', 202, 'paid');
	SELECT idem_forget('acme', 'POST /orders', 'gone');
	TRUNCATE idem_binding;
	SELECT idem_bind('app_acme', 'globex');
	INSERT INTO orders VALUES (2, 'pen');
});
ok( $sub->poll_query_until('app', q{SELECT count(*) = 1 FROM orders WHERE id = 2}),
	'a business row written afterwards arrives');
is($sub->safe_psql('app', $records), $pub->safe_psql('app', $records),
	'so do the keys claimed, finished and forgotten on the publisher since');
is($sub->safe_psql('app', q{SELECT role::text || ':' || tenant FROM idem_binding}),
	'app_acme:globex', 'and the bindings');
is($sub->safe_psql('app', q{SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL}),
	'1', 'the apply worker runs');

# A subscriber session that looked its binding up sees the binding change
# that the apply worker writes (an UPDATE, which fires no statement
# trigger there): a subscribed idem_binding is never cached
my $session = $sub->background_psql('app');
$session->query_safe('SET ROLE app_acme');
is($session->query_safe('SELECT idem_tenant()'), 'globex',
	'a subscriber session of a bound role sees its binding');
$pub->safe_psql('app', q{SELECT idem_bind('app_acme', 'initech')});
ok( $sub->poll_query_until('app',
		q{SELECT tenant = 'initech' FROM idem_binding}),
	'the binding changed on the publisher arrives');
is($session->query_safe('SELECT idem_tenant()'), 'initech',
	'and the session follows it, though it looked the old one up');
$session->quit;

# The subscriber's purge worker leaves an expired record to the publisher's
# purge, whose deletion replicates; it says so at DEBUG1 only.
$pub->safe_psql('app', q{
	SET idem.retry_window = '1s';
	SET idem.retention = '2s';
	SELECT idem_claim('acme', 'POST /orders', 'short', lease => '1s');
});
ok( $sub->poll_query_until('app', q{SELECT count(*) = 1 FROM idem_record
		WHERE key = 'short' AND expires_at < now()}),
	'an expired record on the subscriber');
my $offset = -s $sub->logfile;
$sub->wait_for_log(qr/DEBUG:  idem purge skips database "app": subscription "everything" receives table "idem_record"/, $offset);
$offset = -s $sub->logfile;
$sub->wait_for_log(qr/DEBUG:  idem purge skips database "app"/, $offset);
is($sub->safe_psql('app', q{SELECT count(*) FROM idem_record WHERE key = 'short'}),
	'1', 'two visits of the subscriber\'s purge worker later, the record is there');
is($pub->safe_psql('app', 'SELECT idem_purge()'), '1', 'the publisher purges it');
ok( $sub->poll_query_until('app', q{SELECT count(*) = 0 FROM idem_record WHERE key = 'short'}),
	'and the deletion replicates');
is($sub->safe_psql('app', $records), $pub->safe_psql('app', $records),
	'the subscriber holds the publisher\'s records');

#
# (2) a publication of a business table only: the subscriber is free
#
$pub->safe_psql('shop', q{
	CREATE PUBLICATION business FOR TABLE orders;
	SELECT idem_claim('acme', 'POST /orders', 'mine');
	INSERT INTO orders VALUES (1, 'book');
});
$sub->safe_psql('shop', "CREATE SUBSCRIPTION business CONNECTION '"
	  . $pub->connstr . " dbname=shop' PUBLICATION business");
$sub->wait_for_subscription_sync($pub, 'business', 'shop');
is($sub->safe_psql('shop', 'SELECT item FROM orders'), 'book', 'the business table replicates');
is( $sub->safe_psql('shop', q{
		SELECT outcome FROM idem_claim('acme', 'POST /orders', 'mine');
		SELECT idem_complete('acme', 'POST /orders', 'mine', 201, 'made');
		SELECT outcome, status FROM idem_replay('acme', 'POST /orders', 'mine');
		SELECT string_agg(outcome, ' ') FROM idem_claim_many('acme', 'POST /orders', ARRAY['mine', 'b']);
		SELECT idem_release('acme', 'POST /orders', 'b');
		SELECT idem_forget('acme', 'POST /orders', 'mine');
		SELECT idem_purge() >= 0}),
	"claimed\n\nreplay|201\nreplay claimed\nt\nt\nt",
	'the subscriber of business tables claims, finishes, replays, forgets and purges');

# One session sees a subscription take idem_record in, and give it up
$pub->safe_psql('shop', 'ALTER PUBLICATION business ADD TABLE idem_record');
($ret, $out, $err) = $sub->psql('shop', q{
	SELECT outcome FROM idem_claim('acme', 'POST /orders', 'before');
	ALTER SUBSCRIPTION business REFRESH PUBLICATION WITH (copy_data = false);
	SELECT outcome FROM idem_claim('acme', 'POST /orders', 'during');
	DROP SUBSCRIPTION business;
	SELECT outcome FROM idem_claim('acme', 'POST /orders', 'after');
}, on_error_stop => 0, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  25006: cannot call idem_claim\(\) on a logical replication subscriber of table "idem_record"/,
	'once the subscription receives idem_record, the same session\'s claims error');
is($out, "claimed\nclaimed", 'before and after that subscription, they are claimed');
is($sub->safe_psql('shop', q{SELECT string_agg(key, ' ' ORDER BY key) FROM idem_record
		WHERE key IN ('before', 'during', 'after')}),
	'after before', 'and the refused claim wrote nothing');

my $log = slurp_file($sub->logfile);
unlike($log, qr/duplicate key value violates unique constraint/,
	'no duplicate key stopped an apply worker');
unlike($log, qr/background worker "idem purge" .* exited with exit code [^0]/,
	'no purge worker failed');

$sub->stop;
$pub->stop;
done_testing();
