# test/t/092_sql_edition_update.pl: the SQL edition's update to the next
# release, as its users will take it: the next release's idem_tle.sql run by
# a member of pgtle_admin, then ALTER EXTENSION idem UPDATE; or the next
# release's idem.sql run by the database's owner where this release's was.
# The next release is made here from the checkout: a copy of the tree with
# the version after idem.control's, a C upgrade script that adds a function
# (as a release's would), and a body of edition.sql changed with no upgrade
# script naming it, which the update must carry as well (generate.py replays
# every function).  Records written before the update replay byte for byte
# after it.
use strict;
use warnings;
use File::Copy;
use File::Path qw(make_path);
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

# the next release, in a copy of what generate.py reads
my $control = slurp_file('idem.control');
$control =~ /default_version = '([^']+)'/ or BAIL_OUT('no default_version');
my $this = $1;
my @v = split /\./, $this;
$v[-1]++;
my $next = join '.', @v;
my $tree = PostgreSQL::Test::Utils::tempdir;
make_path("$tree/sql-edition");
copy($_, "$tree/$_") or BAIL_OUT("copy $_: $!") for glob('idem--*.sql');
copy("sql-edition/generate.py", "$tree/sql-edition/") or BAIL_OUT("copy: $!");
$control =~ s/default_version = '[^']+'/default_version = '$next'/;
append_to_file("$tree/idem.control", $control);
# what a release's upgrade script holds: a table, and a function of the
# library, whose SQL edition body is in edition.sql
my $added = q{
CREATE TABLE idem_next_table (id integer PRIMARY KEY);

REVOKE ALL ON idem_next_table FROM PUBLIC;

CREATE FUNCTION idem_next_release()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_next_release'
LANGUAGE C STABLE;

REVOKE ALL ON FUNCTION idem_next_release() FROM PUBLIC;
};
append_to_file("$tree/idem--$this--$next.sql", $added);
append_to_file("$tree/idem--$next.sql", slurp_file("idem--$this.sql") . $added);
my $edition = slurp_file('sql-edition/edition.sql');
$edition =~ s/^(--\@ body idem_tenant\(\)[^\n]*\n)/$1-- changed in the next release\n/m
  or BAIL_OUT('edition.sql has no body of idem_tenant()');
$edition .= q{
--@ body idem_next_release() LANGUAGE sql
	SELECT 'next'::text
--@ end
};
append_to_file("$tree/sql-edition/edition.sql", $edition);
my ($gout, $gerr);
IPC::Run::run([ 'python3', "$tree/sql-edition/generate.py" ], '>', \$gout, '2>', \$gerr)
  or BAIL_OUT("generate.py of the next release: $gerr");

my $node = PostgreSQL::Test::Cluster->new('update',
	install_path => $ENV{IDEM_TEST_TLE_INSTALL});
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tle'");
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE admin LOGIN;
	CREATE ROLE app_role LOGIN;
	CREATE DATABASE tle OWNER admin;
	CREATE DATABASE plain OWNER admin;
});
for my $db ('tle', 'plain')
{
	$node->safe_psql($db, q{
		ALTER SCHEMA public OWNER TO admin;
		GRANT USAGE ON SCHEMA public TO PUBLIC;
	});
}
$node->safe_psql('tle', q{CREATE EXTENSION pg_tle; GRANT pgtle_admin TO admin;});

# run FILE as admin with psql: (ok, stdout, stderr)
sub run_file
{
	my ($db, $file) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ $ENV{IDEM_TEST_TLE_INSTALL} . '/bin/psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
		  '-U', 'admin', '-h', $node->host, '-p', $node->port, '-d', $db, '-f', $file ],
		'>', \$out, '2>', \$err);
	return ($ok, $out, $err);
}

sub as_admin
{
	my ($db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, $sql, on_error_stop => 1,
		extra_params => [ '-U', 'admin' ]);
	is($ret, 0, "$db: no error") or diag($err);
	return $out;
}

my $write = q{
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k1', 'req');
	SELECT idem_complete('t', 'POST /o', 'k1', 201, '\x00ff0a'::bytea, headers => '{"Location": "/o/1"}');
};
my $read = q{
	SELECT outcome, status, encode(body, 'hex'), headers FROM idem_claim('t', 'POST /o', 'k1', 'req');
};
my $replay = "replay|201|00ff0a|{\"Location\": \"/o/1\"}";
# a helper of this release that the next one no longer defines
my $obsolete = q{
	CREATE FUNCTION idem_sql_obsolete() RETURNS integer LANGUAGE sql AS 'SELECT 1';
};
my $after = q{
	SELECT idem_next_release();
	SELECT count(*) FROM idem_next_table;
	SELECT to_regprocedure('idem_sql_obsolete()') IS NULL;
	SELECT has_function_privilege('app_role', 'idem_next_release()', 'EXECUTE');
	SELECT prosrc LIKE '%changed in the next release%' FROM pg_proc WHERE oid = 'idem_tenant()'::regprocedure;
	SELECT outcome FROM idem_claim('t', 'POST /o', 'k2', 'req');
};
my $after_out = "next\n0\nt\nf\nt\nclaimed";

# through pg_tle
my ($ok, $out, $err) = run_file('tle', 'sql-edition/idem_tle.sql');
ok($ok, "pg_tle: this release's idem_tle.sql") or diag($err);
as_admin('tle', 'CREATE EXTENSION idem');
as_admin('tle', $write . $obsolete . 'ALTER EXTENSION idem ADD FUNCTION idem_sql_obsolete();');
($ok, $out, $err) = run_file('tle', "$tree/sql-edition/idem_tle.sql");
ok($ok, "pg_tle: the next release's idem_tle.sql where this one's is registered") or diag($err);
($ok, $out, $err) = run_file('tle', "$tree/sql-edition/idem_tle.sql");
ok($ok, 'pg_tle: and again, which changes nothing') or diag($err);
is(as_admin('tle', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$this, 'the extension stays at this release until ALTER EXTENSION');
($ok, $out, $err) = run_file('tle', 'sql-edition/idem_tle.sql');
ok($ok, "pg_tle: this release's file run again") or diag($err);
is(as_admin('tle', q{SELECT default_version FROM pgtle.available_extensions() WHERE name = 'idem'}),
	$next, 'which leaves the next release the default');
is(as_admin('tle', q{ALTER EXTENSION idem UPDATE; SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$next, 'ALTER EXTENSION idem UPDATE takes it to the next release');
is(as_admin('tle', $read), $replay, 'pg_tle: a record of this release replays byte for byte after the update');
is(as_admin('tle', $after), $after_out,
	"pg_tle: the next release's function (not executable by PUBLIC), table and changed body are in place, this one's helper gone");

# the plain script
($ok, $out, $err) = run_file('plain', 'sql-edition/idem.sql');
ok($ok, "plain: this release's idem.sql") or diag($err);
as_admin('plain', $write . $obsolete);
($ok, $out, $err) = run_file('plain', "$tree/sql-edition/idem.sql");
ok($ok, "plain: the next release's idem.sql where this one's was run") or diag($err);
like($out, qr/updating idem in schema public from \Q$this\E to \Q$next\E/, 'says that it updates');
is(as_admin('plain', $read), $replay, 'plain: a record of this release replays byte for byte after the update');
is(as_admin('plain', $after), $after_out,
	"plain: the next release's function (not executable by PUBLIC), table and changed body are in place, this one's helper gone");
($ok, $out, $err) = run_file('plain', "$tree/sql-edition/idem.sql");
ok($ok && $out =~ /idem \Q$next\E is already installed/, 'plain: run again, it changes nothing')
  or diag($err);
($ok, $out, $err) = run_file('plain', 'sql-edition/idem.sql');
ok(!$ok && $err =~ /another version of idem is installed in this schema/,
	"plain: this release's file refuses to run over the next's") or diag($err);

$node->stop;
done_testing();
