# test/t/091_sql_edition_tle.pl: the SQL edition installed through pg_tle,
# as on Amazon RDS, Aurora or Supabase: a server with pg_tle preloaded and
# no idem library or control file (test/run.sh makes that installation,
# $IDEM_TEST_TLE_INSTALL, from the pg_tle that test/tle/build.sh built), a
# role that is not a superuser but a member of pgtle_admin, which runs
# sql-edition/idem_tle.sql and CREATE EXTENSION idem.  The calls themselves
# are test/t/090_sql_edition.pl's; this checks the route and that the
# extension so created answers as the C edition does.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

if (!$ENV{IDEM_TEST_TLE_INSTALL})
{
	plan skip_all => 'no pg_tle here: '
	  . ($ENV{IDEM_TEST_TLE_SKIP} // 'run make test as root, or sudo bash test/tle/build.sh');
}
system('python3', 'sql-edition/generate.py') == 0
  or BAIL_OUT('sql-edition/generate.py failed');

my $node = PostgreSQL::Test::Cluster->new('tle',
	install_path => $ENV{IDEM_TEST_TLE_INSTALL});
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tle'");
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE admin LOGIN;
	CREATE ROLE acme_role LOGIN;
	GRANT acme_role TO admin;
	CREATE DATABASE app OWNER admin;
});
$node->safe_psql('app', q{
	CREATE EXTENSION pg_tle;
	GRANT pgtle_admin TO admin;
	ALTER SCHEMA public OWNER TO admin;
	GRANT USAGE ON SCHEMA public TO PUBLIC;
});
is($node->safe_psql('app', q{
	SELECT count(*) FROM pg_available_extensions WHERE name = 'idem'}),
	'0', 'the server has no idem of its own');

my ($ret, $out, $err);
sub as
{
	my ($role, $sql) = @_;
	return $node->psql('app', $sql, on_error_stop => 1,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
}

my $ok = IPC::Run::run(
	[ $ENV{IDEM_TEST_TLE_INSTALL} . '/bin/psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
	  '-U', 'admin', '-h', $node->host, '-p', $node->port, '-d', 'app',
	  '-f', 'sql-edition/idem_tle.sql' ],
	'>', \$out, '2>', \$err);
ok($ok, 'a member of pgtle_admin, not a superuser, registers idem with pg_tle') or diag($err);
($ret, $out, $err) = as('admin', q{CREATE EXTENSION idem; SELECT extversion FROM pg_extension WHERE extname = 'idem'});
is($ret, 0, 'and creates the extension') or diag($err);
my $control = slurp_file('idem.control');
$control =~ /default_version = '([^']+)'/;
is($out, $1, "at idem.control's version");

($ret, $out) = as('admin', q{
	SELECT outcome, attempt FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT idem_complete('t', 'POST /o', 'k1', 201, '\x00ff'::bytea, headers => '{"Location": "/o/1"}');
	SELECT outcome, status, encode(body, 'hex'), headers FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k1', 'other');
	SELECT idem_edition();
});
is($out, "claimed|1\n\nreplay|201|00ff|{\"Location\": \"/o/1\"}\nmismatch\nsql",
	'claimed, replay byte for byte, mismatch');

my $holder = $node->background_psql('app', extra_params => [ '-U', 'admin' ]);
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT idem_claim('t', 'POST /o', 'open')});
($ret, $out) = as('admin', q{SET lock_timeout = '3s'; SELECT outcome FROM idem_claim('t', 'POST /o', 'open')});
is($out, 'in_progress', 'an uncommitted claim answers in_progress without waiting');
$holder->query_safe(q{ROLLBACK});
$holder->quit;

($ret, $out, $err) = as('admin', q{
	SELECT idem_bind('acme_role', 'acme');
	SET ROLE acme_role;
	SELECT idem_claim('globex', 'e', 'k')});
like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"/,
	'the binding holds under SET ROLE');
($ret, $out, $err) = as('acme_role', q{SELECT idem_release('t', 'POST /o', 'k1')});
like($err, qr/ERROR:  42501:/, 'a bound role reaches no other tenant');

$node->stop;
done_testing();
