# test/t/022_binding_restore.pl: bindings of roles that no longer exist.
#
# A bound role that is dropped leaves its binding behind (DROP ROLE fires no
# event trigger in a database): idem_unbind() removes it by the role's OID,
# and the documented query lists such bindings.  A dump restored into a
# cluster that lacks one of the bound roles restores every other binding,
# enforced, and reports the missing role with a WARNING.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('source');
$node->init;
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE app_first LOGIN;
	CREATE ROLE app_b LOGIN;
	CREATE ROLE app_gone;
	CREATE DATABASE app;
});
$node->safe_psql('app', q{
	CREATE EXTENSION idem;
	SELECT idem_bind('app_first', 'acme');
	SELECT idem_bind('app_b', 'globex');
	SELECT idem_bind('app_gone', 'gone');
	SELECT idem_claim('globex', 'POST /orders', 'g1');
	SELECT idem_complete('globex', 'POST /orders', 'g1', 201, 'globex secret');
	GRANT SELECT ON idem_record TO app_first;
});

# a dropped role's binding stays, listed by the documented query, and
# idem_unbind() removes it by OID
my $gone = $node->safe_psql('app', q{SELECT 'app_gone'::regrole::oid});
$node->safe_psql('postgres', 'DROP ROLE app_gone');
my $orphans = q{
	SELECT b.role::oid, b.tenant FROM idem_binding b
	 WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = b.role)};
is($node->safe_psql('app', $orphans), "$gone|gone",
	'the binding of a dropped role is listed as orphaned');
my ($ret, $out, $err) = $node->psql('app', "SELECT idem_unbind($gone)",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
is($out, 't', 'idem_unbind(oid) removes the binding of a dropped role') or diag($err);
is($node->safe_psql('app', $orphans), '', 'no orphaned binding is left');
($ret, $out, $err) = $node->psql('app', "SELECT idem_unbind('$gone'::regrole)",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  42704: role with OID $gone does not exist/,
	'a second idem_unbind of the dropped role errors: there is nothing left to unbind');
is($node->safe_psql('app', q{SELECT count(*) FROM idem_binding}), '2',
	'the other bindings are kept');

# a renamed role keeps its binding, and is dumped by its new name
$node->safe_psql('postgres', 'ALTER ROLE app_first RENAME TO app_a');
is($node->safe_psql('app', q{SELECT role, tenant FROM idem_binding ORDER BY tenant}),
	"app_a|acme\napp_b|globex", 'a renamed role keeps its binding');

# a dump of the bindings of app_a and app_b, restored into a cluster
# without app_b
my $dir = PostgreSQL::Test::Utils::tempdir();
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dir/app.dump", '-d', $node->connstr('app') ],
	'pg_dump');

my $target = PostgreSQL::Test::Cluster->new('target');
$target->init;
$target->start;
$target->safe_psql('postgres', q{
	CREATE ROLE app_other;
	CREATE ROLE app_a LOGIN;
	CREATE DATABASE app;
});
my $restore_out = '';
my $restore_err = '';
# pg_restore shows the server's warnings with --verbose only; the server
# logs them anyway
my $log_offset = -s $target->logfile;
IPC::Run::run([ 'pg_restore', '--verbose', '-d', $target->connstr('app'), "$dir/app.dump" ],
	'>', \$restore_out, '2>', \$restore_err);
unlike($restore_err, qr/error:.*idem_binding|COPY failed for table "idem_binding"/,
	'the bindings restore without an error') or diag($restore_err);
like($restore_err, qr/WARNING:  role "app_b" does not exist\nDETAIL:  Its idem tenant binding is skipped\./,
	'the missing role is reported to pg_restore --verbose');
like(slurp_file($target->logfile, $log_offset),
	qr/WARNING:  role "app_b" does not exist\n.*DETAIL:  Its idem tenant binding is skipped\.\n.*HINT:  Create the role, then bind it again with idem_bind\(\)\.\n.*CONTEXT:  COPY idem_binding, line \d+, column role: "app_b"/,
	'and in the server log, with the line of the COPY');
is($target->safe_psql('app', q{SELECT role, tenant FROM idem_binding ORDER BY tenant}),
	'app_a|acme', "the existing role's binding is restored");
($ret, $out, $err) = $target->psql('app',
	q{SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1')},
	extra_params => [ '-U', 'app_a', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"/,
	'and it is enforced');
is($target->safe_psql('app', q{SELECT count(*) FROM idem_record WHERE tenant = 'globex'}), '1',
	'the records are restored too');

$target->stop;
$node->stop;
done_testing();
