# test/t/090_sql_edition.pl: the SQL edition (sql-edition/idem.sql) on a
# server where idem's library is never loaded, installed by the database's
# owner, who is not a superuser, as on a managed service.
#
# sql-edition/README.md says what the edition holds so far; what it does
# not answers 0A000.  This checks it against the contract: the outcomes,
# fencing, bad input, an uncommitted claim answered in_progress without
# waiting, a retry storm with no duplicate execution, batches, the outbox
# (takes that skip locked messages, fencing, ordering keys, pauses),
# budgets, freezes, the binding under SET ROLE and a bound role's SECURITY
# DEFINER function, a SET that does not lift a cap, and a record that moves
# between the editions with a data-only pg_dump and replays byte for byte.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

system('python3', 'sql-edition/generate.py') == 0
  or BAIL_OUT('sql-edition/generate.py failed');

my $node = PostgreSQL::Test::Cluster->new('sqled');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE ROLE acme_role LOGIN;
	CREATE ROLE stray LOGIN;
	GRANT acme_role TO app;
	CREATE DATABASE appdb OWNER app;
});
$node->safe_psql('appdb', q{ALTER SCHEMA public OWNER TO app});

# run sql as role in appdb: (exit code, stdout, stderr)
sub as
{
	my ($role, $sql, $db) = @_;
	my ($ret, $out, $err) = $node->psql($db // 'appdb', $sql,
		on_error_stop => 1,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
	return ($ret, $out, $err);
}

sub install
{
	my ($db) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-U', 'app',
		  '-h', $node->host, '-p', $node->port, '-d', $db,
		  '-f', 'sql-edition/idem.sql' ],
		'>', \$out, '2>', \$err);
	return $ok ? '' : $err;
}

my $script = slurp_file('sql-edition/idem.sql');
unlike($script, qr/MODULE_PATHNAME|\$libdir|LANGUAGE C\b/,
	'the generated script holds no C function, MODULE_PATHNAME or $libdir');

is(install('appdb'), '', 'the database owner, not a superuser, installs idem.sql');
is($node->safe_psql('appdb', q{SELECT count(*) FROM pg_extension WHERE extname = 'idem'}),
	'0', 'no extension idem is created');
my $objects = $node->safe_psql('appdb', q{
	SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace});
is(install('appdb'), '', 'the same script again: no error');
is($node->safe_psql('appdb', q{
	SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace}),
	$objects, 'and nothing changed');
# a schema where others may create objects is refused; another schema serves
# callers whose search_path does not name it
$node->safe_psql('postgres', q{CREATE DATABASE opendb OWNER app});
$node->safe_psql('opendb', q{GRANT CREATE ON SCHEMA public TO PUBLIC});
like(install('opendb'), qr/ERROR:  schema "public" lets other roles create objects/,
	'a schema where PUBLIC may create objects is refused');
$node->safe_psql('opendb', q{CREATE SCHEMA idem AUTHORIZATION app; GRANT USAGE ON SCHEMA idem TO PUBLIC});
{
	local $ENV{PGOPTIONS} = '-c search_path=idem';
	is(install('opendb'), '', 'idem.sql in a schema of its own');
}
is($node->safe_psql('opendb', q{SELECT outcome FROM idem.idem_claim('t', 'e', 'k')}),
	'claimed', 'called with its schema, from a search_path without it');

$node->safe_psql('appdb', q{
	GRANT USAGE ON SCHEMA public TO PUBLIC;
	CREATE TABLE effects (key text);
	GRANT ALL ON effects TO PUBLIC;
});

my ($ret, $out, $err);

# the outcomes, as the C edition answers them
($ret, $out) = as('stray', q{
	SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT idem_complete('t', 'POST /o', 'k1', 201, '\x00ff0a41'::bytea,
						 headers => '{"Location": "/o/1", "Vary": ["a", "b"]}');
	SELECT outcome, status, encode(body, 'hex'), headers
	  FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k1', 'other request');
	SELECT outcome FROM idem_replay('t', 'POST /o', 'k1', 'req');
	SELECT count(*) FROM idem_replay('t', 'POST /o', 'fresh');
});
is($out, join("\n",
	'claimed|1', 'in_progress', '',
	'replay|201|00ff0a41|{"Vary": ["a", "b"], "Location": "/o/1"}',
	'mismatch', 'replay', '0'),
	'claimed, in_progress, replay byte for byte with headers, mismatch, idem_replay');

($ret, $out) = as('stray', q{
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k2', '{"a": 1, "b": 2}'::jsonb);
	SELECT idem_fail('t', 'POST /o', 'k2', 503, 'down'::text, retryable => true);
	SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'k2', '{"b":2,"a":1}'::jsonb);
	SELECT idem_fail('t', 'POST /o', 'k2', 402, 'declined'::text, attempt => 2);
	SELECT outcome, status, convert_from(body, 'UTF8') FROM idem_claim('t', 'POST /o', 'k2');
});
is($out, join("\n", 'claimed', '', 'claimed|2', '', 'replay|402|declined'),
	'a retryable failure executes again, fenced; a business failure replays; jsonb fingerprints are canonical');

($ret, $out, $err) = as('stray', q{
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k3');
	SELECT idem_release('t', 'POST /o', 'k3');
	SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'k3');
	SELECT idem_complete('t', 'POST /o', 'k3', 200, 'stale'::text, attempt => 1);
});
like($err, qr/ERROR:  55000: idem_complete\(\): idem key "k3" of endpoint "POST \/o" \(tenant "t"\) has no matching pending claim\nDETAIL:  Attempt 1 is not the key's current attempt/,
	'a stale attempt cannot finish the next one (55000)');

($ret, $out) = as('stray', q{
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k4', lease => '10 ms');
	SELECT pg_sleep(0.05);
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k4');
});
is($out, "claimed\n\nunknown", 'a committed claim past its lease is unknown');
($ret, $out) = as('stray', q{
	BEGIN;
	SAVEPOINT s;
	SELECT outcome FROM idem_claim('t', 'POST /o', 'own', lease => '20 s');
	RELEASE s;
	SELECT outcome, clock_timestamp() - statement_timestamp() < interval '5 s'
	  FROM idem_claim('t', 'POST /o', 'own', wait => true);
	COMMIT;
});
is($out, "claimed\nin_progress|t", 'wait => true on its own claim, made in a subtransaction: in_progress at once');

for my $case (
	[ q{SELECT idem_claim(NULL, 'e', 'k')}, '22004', 'a NULL tenant' ],
	[ q{SELECT idem_claim('t', '', 'k')}, '22023', 'an empty endpoint' ],
	[ q{SELECT idem_claim('t', 'e', repeat('k', 256))}, '22001', 'a key of 256 bytes' ],
	[ q{SELECT idem_complete('t', 'POST /o', 'k4', 99, 'x'::text)}, '22023', 'status 99' ],
	[ q{SELECT idem_complete('t', 'POST /o', 'nothing', 200, 'x'::text)}, '55000', 'a key without a claim' ],
	[ q{SELECT idem_claim('t', 'e', 'k', lease => '-1 s')}, '22023', 'a negative lease' ],
	[ q{SELECT idem_claim('t', 'e', 'k', retention => '30 min')}, '22023', 'a retention within the retry window' ],
	[ q{SELECT * FROM idem_stats_read()}, '0A000', 'what only the library can do' ])
{
	($ret, $out, $err) = as('app', $case->[0]);
	like($err, qr/ERROR:  $case->[1]:/, "$case->[2]: $case->[1]");
}

# an uncommitted claim: another session answers at once
my $holder = $node->background_psql('appdb', extra_params => [ '-U', 'stray' ]);
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT idem_claim('t', 'POST /o', 'open')});
($ret, $out) = as('stray', q{
	SET lock_timeout = '3s';
	SELECT outcome FROM idem_claim('t', 'POST /o', 'open');
	SELECT outcome FROM idem_replay('t', 'POST /o', 'open');
});
is($out, "in_progress\nin_progress", 'an uncommitted claim of the key: a claim and a replay answer in_progress without waiting');
$holder->query_safe(q{ROLLBACK});
($ret, $out) = as('stray', q{SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'open')});
is($out, 'claimed|1', 'a rolled-back claim leaves nothing behind');

# batches
($ret, $out) = as('stray', q{
	SELECT string_agg(key || '=' || outcome, ',' ORDER BY ord)
	  FROM idem_claim_many('t', 'POST /b', ARRAY['a', 'b', 'a']) WITH ORDINALITY AS c(key, outcome, s, b, h, at, ca, ea, ord);
	SELECT idem_complete_many('t', 'POST /b', ARRAY['a', 'b'], ARRAY[200, 201], ARRAY['A', 'B']::bytea[]);
	SELECT string_agg(key || '=' || outcome || coalesce(':' || status, ''), ',')
	  FROM idem_claim_many('t', 'POST /b', ARRAY['a', 'b', 'c']);
});
is($out, "a=claimed,b=claimed,a=in_progress\n2\na=replay:200,b=replay:201,c=claimed",
	'idem_claim_many answers each element as idem_claim would; idem_complete_many finishes them');
($ret, $out, $err) = as('stray', q{SELECT idem_claim_many('t', 'POST /b', ARRAY['x'], ARRAY['f1', 'f2'])});
like($err, qr/ERROR:  22023: fingerprints must have as many elements as keys/, 'arrays of other lengths: 22023');

# the outbox
($ret, $out) = as('stray', q{
	SELECT outcome FROM idem_enqueue('t', 'mail', 'm1', 'hello'::text);
	SELECT outcome FROM idem_enqueue('t', 'mail', 'm1', 'hello'::text);
	SELECT outcome FROM idem_enqueue('t', 'mail', 'm1', 'other'::text);
	SELECT outcome FROM idem_enqueue('t', 'mail', 'm2', 'second'::text);
});
is($out, "enqueued\nduplicate\nmismatch\nenqueued", 'idem_enqueue: enqueued, duplicate, mismatch');
my $taker = $node->background_psql('appdb', extra_params => [ '-U', 'stray' ]);
$taker->query_safe(q{BEGIN});
my $first = $taker->query_safe(q{SELECT key || ':' || attempt FROM idem_take('mail', 1)});
($ret, $out) = as('stray', q{SELECT key || ':' || attempt FROM idem_take('mail', 5)});
is("$first $out", 'm1:1 m2:1', 'a take skips the message another take holds');
$taker->query_safe(q{COMMIT});
$taker->quit;
($ret, $out, $err) = as('stray', q{
	SELECT idem_retry(id, 1, 'timeout', '0 s') FROM idem_message('t', 'mail', 'm1');
	SELECT key || ':' || attempt FROM idem_take('mail', 5);
	SELECT idem_delivered(id, 1) FROM idem_message('t', 'mail', 'm1');
});
is($out, "queued\nm1:2", 'a retried message is taken again with the next attempt');
like($err, qr/ERROR:  55000: idem_delivered\(\): attempt 1 of outbox message \d+ is not its live lease/,
	'a stale attempt cannot finish the next lease (55000)');
($ret, $out) = as('stray', q{
	SELECT idem_delivered(id, 2, 250, 'sent'::bytea) FROM idem_message('t', 'mail', 'm1');
	SELECT state, status, convert_from(body, 'UTF8') FROM idem_message('t', 'mail', 'm1');
	SELECT outcome FROM idem_enqueue('t', 'log', 'o1', 'one'::text, ordering_key => 'acct');
	SELECT outcome FROM idem_enqueue('t', 'log', 'o2', 'two'::text, ordering_key => 'acct');
	SELECT string_agg(key, ',') FROM idem_take('log', 5);
});
is($out, "\ndelivered|250|sent\nenqueued\nenqueued\no1",
	'delivered with the answer; an ordering key holds a later message back');
($ret, $out, $err) = as('stray', q{SELECT idem_requeue(1)});
like($err, qr/ERROR:  42501:/, 'idem_requeue is not for PUBLIC');
($ret, $out) = as('app', q{
	SELECT idem_pause('log');
	SELECT idem_delivered(id, 1) FROM idem_message('t', 'log', 'o1');
	SELECT count(*) FROM idem_take('log', 5);
	SELECT idem_resume('log');
	SELECT string_agg(key, ',') FROM idem_take('log', 5);
});
is($out, "t\n\n0\nt\no2", 'a paused topic is not taken until resumed');

# budgets and freezes
($ret, $out, $err) = as('stray', q{
	SELECT idem_budget('t', 'task', 2);
	BEGIN; SELECT idem_spend('t', 'task'); ROLLBACK;
	SELECT idem_spend('t', 'task', 2);
	SELECT idem_spend('t', 'task');
});
is($out, "2\n1\n0", 'a rolled-back spend is not spent');
like($err, qr/ERROR:  IB001: idem budget of task "task" cannot cover 1 more attempt/, 'a spent budget refuses (IB001)');
($ret, $out) = as('app', q{
	SELECT idem_freeze('t', 'POST /f', 'incident');
	SELECT outcome FROM idem_claim('t', 'POST /f', 'new');
	SELECT reason FROM idem_frozen('t', 'POST /f');
	SELECT idem_thaw('t', 'POST /f');
	SELECT outcome FROM idem_claim('t', 'POST /f', 'new');
});
is($out, "t\nfrozen\nincident\nt\nclaimed", 'a frozen endpoint answers frozen until thawed');

# the installer's settings; a SET of the same name changes nothing
as('app', q{INSERT INTO idem_setting VALUES ('idem.max_retention', '30 days')});
($ret, $out, $err) = as('stray', q{
	SET idem.max_retention = '100d';
	SELECT outcome FROM idem_claim('t', 'e', 'capped', retention => '31 days');
});
like($err, qr/ERROR:  22023: retention 31 days is longer than idem.max_retention/,
	'SET idem.max_retention by another role does not lift the cap');
($ret, $out, $err) = as('stray', q{
	INSERT INTO idem_setting VALUES ('idem.max_lease', '1 year')});
like($err, qr/ERROR:  42501:/, 'only the installer writes idem_setting');
as('app', q{DELETE FROM idem_setting});

# decision logs: the installer turns them on; a SET does not
my $log_offset = -s $node->logfile;
as('stray', q{
	SET idem.log_outcomes = on;
	SELECT idem_claim('t', 'POST /log', 'not-logged');});
as('app', q{INSERT INTO idem_setting VALUES ('idem.log_outcomes', 'on')});
as('stray', q{
	BEGIN; SET LOCAL idem.trace = 't-1';
	SELECT idem_claim('t', 'POST /log', 'log"1'); COMMIT;});
as('app', q{DELETE FROM idem_setting});
my $log = substr(slurp_file($node->logfile), $log_offset);
like($log, qr/LOG:  idem claim: tenant="t" endpoint="POST \/log" key="log\\"1" outcome=claimed attempt=1 trace="t-1"/,
	'idem.log_outcomes = on in idem_setting: one line per claim, in the C edition\'s format');
unlike($log, qr/idem claim: .*not-logged/, 'a SET idem.log_outcomes by another role logs nothing');

# the tenant binding
($ret, $out, $err) = as('stray', q{SELECT idem_bind('stray', 'acme')});
like($err, qr/ERROR:  42501:/, "idem_bind is the installer's");
as('app', q{
	SELECT idem_bind('acme_role', 'acme');
	CREATE SCHEMA acme AUTHORIZATION acme_role;
	GRANT USAGE ON SCHEMA acme TO PUBLIC;
	SET search_path = acme, public;
	CREATE FUNCTION acme_claim(tenant text) RETURNS text
		LANGUAGE sql SECURITY DEFINER
		AS $$ SELECT outcome FROM public.idem_claim(tenant, 'e', 'definer') $$;
	ALTER FUNCTION acme_claim(text) OWNER TO acme_role;
	CREATE FUNCTION acme_replay(tenant text) RETURNS bytea
		LANGUAGE plpgsql SECURITY DEFINER
		AS $$ BEGIN RETURN (SELECT body FROM public.idem_sql_replay(public.idem_sql_ticket(), tenant, 'POST /o', 'k1', NULL)); END $$;
	ALTER FUNCTION acme_replay(text) OWNER TO acme_role;
});
($ret, $out) = as('acme_role', q{
	SELECT idem_tenant();
	SELECT outcome FROM idem_claim('acme', 'e', 'b1');});
is($out, "acme\nclaimed", 'a bound role claims in its tenant');
for my $case (
	[ 'acme_role', q{SELECT idem_claim('globex', 'e', 'b1')}, 'a bound role, another tenant' ],
	[ 'acme_role', q{SELECT count(*) FROM idem_replay('t', 'POST /o', 'k1')}, 'a bound role replays no other tenant' ],
	[ 'app', q{SET ROLE acme_role; SELECT idem_claim('globex', 'e', 'b2')}, 'SET ROLE into a bound role' ],
	[ 'stray', q{SELECT acme.acme_claim('globex')}, "a bound role's SECURITY DEFINER function" ],
	[ 'acme_role', q{SELECT idem_sql_claim(idem_sql_ticket(), 'globex', 'e', 'b3', NULL, false, NULL, NULL, NULL)},
	  'a bound role calling a worker itself' ],
	[ 'stray', q{SELECT acme.acme_replay('globex')}, "a bound role's SECURITY DEFINER function calling a worker" ],
	[ 'acme_role', q{DO $$ BEGIN PERFORM idem_sql_replay(idem_sql_ticket(), 'globex', 'POST /o', 'k1', NULL); END $$},
	  'a DO block calling a worker' ])
{
	($ret, $out, $err) = as($case->[0], $case->[1]);
	like($err, qr/ERROR:  42501: permission denied for idem tenant "(globex|t)"/, "$case->[2]: 42501");
}
($ret, $out, $err) = as('acme_role', q{INSERT INTO idem_sql_ticket (role) VALUES ('stray'::regrole)});
like($err, qr/ERROR:  23514: new row for relation "idem_sql_ticket" violates check constraint/,
	'a ticket names the role that inserts it');
($ret, $out, $err) = as('stray', q{
	INSERT INTO idem_sql_ticket (id) OVERRIDING SYSTEM VALUE SELECT g FROM generate_series(1, 100) g});
like($err, qr/ERROR:  42501: permission denied for table idem_sql_ticket/,
	'no role can plant the ids of the next tickets');
$node->safe_psql('postgres', q{CREATE ROLE "ACME_ROLE" LOGIN; CREATE ROLE "APP" LOGIN});
($ret, $out) = as('ACME_ROLE', q{SELECT idem_tenant() IS NULL});
is($out, 't', 'a role whose name differs from a bound one only in case is not bound by it');
($ret, $out, $err) = as('APP', q{SELECT idem_sql_forget(idem_sql_ticket(), 'acme', 'e', 'b1')});
like($err, qr/ERROR:  42501: permission denied for function idem_forget/,
	'nor does a role act as the installer whose name differs only in case');
($ret, $out, $err) = as('acme_role', q{SELECT idem_sql_replay(1, 'globex', 'POST /o', 'k1', NULL)});
like($err, qr/ERROR:  42501: permission denied: idem call without a ticket of its caller/,
	'a worker without a ticket of the caller refuses');
# once a binding exists, a worker of the calls that need no ticket where
# nothing binds refuses a call without one, whoever makes it
for my $case (
	[ 'acme_role', q{SELECT idem_sql_claim(NULL, 'globex', 'e', 'b4', NULL, false, NULL, NULL, NULL)}, 'a claim' ],
	[ 'stray', q{SELECT count(*) FROM idem_sql_replay(NULL, 't', 'POST /o', 'k1', NULL)}, 'a replay' ],
	[ 'acme_role', q{SELECT idem_sql_finish(NULL, 'complete', 'globex', 'e', 'b4', 200, NULL, NULL, NULL)}, 'a complete' ],
	[ 'stray', q{SELECT count(*) FROM idem_sql_take(NULL, 'mail', 10, NULL, NULL)}, 'a take' ])
{
	($ret, $out, $err) = as($case->[0], $case->[1]);
	like($err, qr/ERROR:  42501: permission denied: idem call without a ticket of its caller/,
		"$case->[2] without a ticket while a binding exists: 42501");
}
# ticket 0, idem_claim's first call, only asks for a ticket then
($ret, $out, $err) = as('acme_role', q{
	SELECT outcome IS NULL AND body IS NULL
	  FROM idem_sql_claim(0, 'globex', 'e', 'b4', NULL, false, NULL, NULL, NULL)});
is($out, 't', 'a claim\'s worker handed ticket 0 while a binding exists answers nothing');
is($node->safe_psql('appdb', q{SELECT count(*) FROM idem_record WHERE key = 'b4'}), '0',
	'and claims nothing');
($ret, $out, $err) = as('acme_role', q{
	SELECT idem_sql_finish_message(idem_sql_ticket(), NULL, 1, NULL, NULL, NULL, NULL, NULL)});
like($err, qr/ERROR:  22023: invalid finish of an idem message/,
	'a message\'s worker called with no finish refuses, rather than skip its checks');
($ret, $out, $err) = as('acme_role', q{
	SELECT idem_sql_finish(idem_sql_ticket(), 'dead', 'acme', 'e', 'b1', 200, NULL, NULL, NULL)});
like($err, qr/ERROR:  22023: invalid finish of an idem claim/,
	'so does a claim\'s');
($ret, $out) = as('app', q{SELECT needed FROM idem_sql_tickets});
is($out, 't', 'idem_sql_tickets says a ticket is needed once a binding exists');
($ret, $out, $err) = as('stray', q{SELECT idem_sql_finish_message(NULL, 'requeue', 1, NULL, NULL, NULL, NULL, NULL)});
like($err, qr/ERROR:  42501: permission denied for function idem_requeue/,
	'an operator tool\'s check refuses a call without a ticket');
($ret, $out, $err) = as('stray', q{SELECT idem_sql_list(idem_sql_ticket(), 't', NULL, 10)});
like($err, qr/ERROR:  42501: permission denied for function idem_list/,
	'an operator tool\'s worker needs EXECUTE on the tool');
as('app', q{ALTER FUNCTION idem_forget(text, text, text) RENAME TO idem_forget_renamed});
($ret, $out, $err) = as('stray', q{SELECT idem_sql_forget(idem_sql_ticket(), 't', 'e', 'b1')});
as('app', q{ALTER FUNCTION idem_forget_renamed(text, text, text) RENAME TO idem_forget});
like($err, qr/ERROR:  42501: permission denied for function idem_forget/,
	'nor does an operator tool\'s worker open when its tool cannot be found');
($ret, $out, $err) = as('stray', q{SELECT idem_sql_list(idem_sql_ticket(), 't', NULL, 10)});
like($err, qr/ERROR:  42501: permission denied for function idem_list/,
	'an operator tool\'s worker needs EXECUTE on the tool');
($ret, $out, $err) = as('acme_role', q{SELECT * FROM idem_sql_secret});
like($err, qr/ERROR:  42501:/, 'the salt of the key locks is the installer\'s');
($ret, $out, $err) = as('acme_role', q{SELECT count(*) FROM idem_record});
like($err, qr/ERROR:  42501: permission denied for table idem_record/,
	'a bound role cannot read the table');
($ret, $out) = as('stray', q{SELECT acme.acme_claim('acme')});
is($out, 'claimed', 'the definer function claims in its tenant');
as('app', q{INSERT INTO idem_setting VALUES ('idem.require_binding', 'on')});
($ret, $out, $err) = as('stray', q{SELECT idem_claim('t', 'e', 'unbound')});
like($err, qr/ERROR:  42501: .*\nDETAIL:  Role "stray" is bound to no idem tenant, and idem.require_binding is on/,
	'idem.require_binding refuses an unbound role');
($ret, $out, $err) = as('stray', q{
	SELECT idem_sql_claim(idem_sql_ticket(), 't', 'e', 'unbound', NULL, false, NULL, NULL, NULL)});
like($err, qr/ERROR:  42501: .*\nDETAIL:  Role "stray" is bound to no idem tenant/,
	'nor does calling the worker itself');
# in a session a superuser logged in, a SET may tighten the table's settings
# but never loosen them: SET ROLE lets another role make the SET there
($ret, $out, $err) = $node->psql('appdb', q{
	SET ROLE stray;
	SET idem.require_binding = off;
	SELECT idem_claim('t', 'e', 'unbound');},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  42501: .*\nDETAIL:  Role "stray" is bound to no idem tenant, and idem.require_binding is on/,
	'a SET after SET ROLE in a superuser\'s session does not lift idem.require_binding');
as('app', q{UPDATE idem_setting SET value = 'off'});
as('app', q{INSERT INTO idem_setting VALUES ('idem.max_retention', '30 days')});
($ret, $out, $err) = $node->psql('appdb', q{
	SET ROLE stray;
	SET idem.max_retention = '100d';
	SELECT idem_claim('t', 'e', 'capped', retention => '31 days');},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  22023: retention 31 days is longer than idem.max_retention/,
	'nor does it lift a cap');
($ret, $out, $err) = $node->psql('appdb', q{
	SET idem.max_retention = '2d';
	SELECT idem_claim('t', 'e', 'capped', retention => '3 days');},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  22023: retention 3 days is longer than idem.max_retention \(2d\)/,
	'a smaller cap SET in a superuser\'s session holds');
as('app', q{INSERT INTO idem_setting VALUES ('idem.max_body_size', '1 megabyte')});
($ret, $out, $err) = as('stray', q{
	SELECT idem_claim('t', 'e', 'body');
	SELECT idem_complete('t', 'e', 'body', 200, 'ok');});
like($err, qr/ERROR:  22023: invalid value for parameter "idem.max_body_size": "1 megabyte"/,
	'a body limit the C edition would refuse is an error, not no limit');
as('app', q{UPDATE idem_setting SET value = '2GB' WHERE name = 'idem.max_body_size'});
($ret, $out, $err) = as('stray', q{SELECT idem_complete('t', 'e', 'body', 200, 'ok')});
like($err, qr/ERROR:  22023: 2097152 kB is outside the valid range for parameter "idem.max_body_size" \(0 \.\. 1048575\)/,
	'nor one above its range');
as('app', q{DELETE FROM idem_setting});
as('app', q{INSERT INTO idem_setting VALUES ('idem.max_retention', '-1h')});
($ret, $out, $err) = as('stray', q{SELECT idem_claim('t', 'e', 'negative', retention => '1000 days')});
like($err, qr/ERROR:  22023: invalid value for parameter "idem.max_retention": "-1h"/,
	'a negative cap is an error, not no cap');
as('app', q{UPDATE idem_setting SET name = 'idem.log_outcomes', value = 'all'});
($ret, $out, $err) = as('stray', q{SELECT idem_claim('t', 'e', 'log-all')});
like($err, qr/ERROR:  22023: invalid value for parameter "idem.log_outcomes": "all"/,
	'an idem.log_outcomes the C edition would refuse is an error, not off');
as('app', q{DELETE FROM idem_setting});

# a retry storm: 16 sessions, 40 keys, every effect at most once
my $storm = PostgreSQL::Test::Utils::tempdir() . '/storm.sql';
PostgreSQL::Test::Utils::append_to_file($storm, q{
\set k random(1, 40)
BEGIN;
SELECT outcome = 'claimed' AS claimed FROM idem_claim('storm', 'POST /pay', :k::text, 'same') \gset
\if :claimed
INSERT INTO effects VALUES (:k);
SELECT idem_complete('storm', 'POST /pay', :k::text, 201, 'paid'::text);
\endif
COMMIT;
});
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-T', '8', '-c', '16', '-j', '2', '-f', $storm,
	  '-U', 'stray', '-h', $node->host, '-p', $node->port, 'appdb' ],
	'>', \$out, '2>', \$err);
ok($ok, 'storm: no client error') or diag($err);
is($node->safe_psql('appdb', q{
	SELECT count(*), count(DISTINCT key), max(n)
	  FROM (SELECT key, count(*) AS n FROM effects GROUP BY key) e}),
	'40|40|1', 'storm: every key executed exactly once');

# a record moves between the editions with a data-only dump
$node->safe_psql('postgres', q{CREATE DATABASE cdb});
$node->safe_psql('cdb', q{CREATE EXTENSION idem});
$node->safe_psql('postgres', q{CREATE DATABASE sqldb OWNER app});
$node->safe_psql('sqldb', q{ALTER SCHEMA public OWNER TO app});
is(install('sqldb'), '', 'a second database with the SQL edition');
$node->safe_psql('cdb', q{
	SELECT idem_claim('x', 'POST /c', 'from-c', 'req');
	SELECT idem_complete('x', 'POST /c', 'from-c', 201, '\x00c0ffee'::bytea,
						 headers => '{"Location": "/c"}');
});
my $dumpdir = PostgreSQL::Test::Utils::tempdir();
for my $move ([ 'cdb', 'sqldb' ], [ 'appdb', 'cdb' ])
{
	my ($from, $to) = @$move;
	$node->command_ok(
		[ 'pg_dump', '--data-only', '--table=idem_record', '-f', "$dumpdir/$from.sql",
		  '-h', $node->host, '-p', $node->port, $from ],
		"data-only dump of $from");
	$node->command_ok(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', "$dumpdir/$from.sql",
		  '-h', $node->host, '-p', $node->port, $to ],
		"restored into $to");
}
is($node->safe_psql('sqldb', q{
	SELECT outcome, status, encode(body, 'hex'), headers
	  FROM idem_claim('x', 'POST /c', 'from-c', 'req')}),
	'replay|201|00c0ffee|{"Location": "/c"}',
	'a record of the C edition replays byte for byte in the SQL edition');
is($node->safe_psql('cdb', q{
	SELECT outcome, status, encode(body, 'hex'), headers
	  FROM idem_claim('t', 'POST /o', 'k1', 'req')}),
	'replay|201|00ff0a41|{"Vary": ["a", "b"], "Location": "/o/1"}',
	'a record of the SQL edition replays byte for byte in the C edition');

# the purge: expired records go, a pending claim within its lease stays
as('app', q{
	UPDATE idem_record SET expires_at = now() - interval '1 minute'
	 WHERE tenant = 't' AND key IN ('k1', 'k2');
	UPDATE idem_record SET expires_at = now() - interval '1 minute',
		   lease_expires_at = now() + interval '1 hour', state = 'pending'
	 WHERE tenant = 't' AND key = 'k3';
});
($ret, $out, $err) = as('stray', q{SELECT idem_purge()});
like($err, qr/ERROR:  42501:/, 'idem_purge is not for PUBLIC');
($ret, $out) = as('app', q{
	SELECT idem_purge();
	SELECT string_agg(key, ',' ORDER BY key) FROM idem_record WHERE tenant = 't' AND key LIKE 'k%'});
is($out, "2\nk3,k4", 'idem_purge deletes the expired records, not a live pending claim');
($ret, $out) = as('stray', q{SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'k2')});
is($out, 'claimed|3', 'a purged key starts above its old attempts');

$node->stop;
done_testing();
