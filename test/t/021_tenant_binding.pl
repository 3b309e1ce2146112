# test/t/021_tenant_binding.pl: the tenant binding cannot be lifted, with
# and without idem preloaded: not by connection options, not by SET, SET
# LOCAL, RESET or set_config() before or after idem is loaded, not by
# reaching the bound role with SET ROLE, not by a security definer function
# of an unbound role, not through PgBouncer in transaction mode.  Every
# function and the table read path on another tenant's key give no answer
# of that tenant, and every refusal is SQLSTATE 42501.  Also: the upgrade
# from 0.1.0 turns idem.tenant role settings into bindings and ends with
# the catalog of a fresh install, leftover settings break no login, and
# pg_dump / pg_restore keep the bindings.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('tenant');
$node->init;
$node->start;

# idem 0.1.0 bound roles with a setting; the upgrade turns the settings of
# this database's roles into bindings
$node->safe_psql('postgres', q{
	CREATE ROLE app_acme LOGIN;
	CREATE ROLE app_db LOGIN;
	CREATE ROLE app_empty LOGIN;
	CREATE ROLE app_pool LOGIN NOINHERIT;
	CREATE ROLE app_definer;
	GRANT app_acme TO app_pool;
	CREATE DATABASE app;
	CREATE DATABASE fresh;
	ALTER ROLE app_acme SET idem.tenant = 'acme';
	ALTER ROLE app_db SET idem.tenant = 'globex';
	ALTER ROLE app_db IN DATABASE app SET idem.tenant = 'initech';
	ALTER ROLE app_empty SET idem.tenant = 'globex';
	ALTER ROLE app_empty IN DATABASE app SET idem.tenant = '';
});
$node->safe_psql('app', q{CREATE EXTENSION idem VERSION '0.1.0'});

# until the update, this library serves none of 0.1.0's objects there (it
# could not read bindings either): it refuses, in one place and one way
my ($ret, $out, $err) = $node->psql('app',
	q{SELECT outcome FROM idem_claim('acme', 'POST /orders', 'early')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  55000: extension "idem" is at version 0\.1\.0 in this database, older than this library serves/,
	'before ALTER EXTENSION UPDATE every call is refused with 55000');
$node->safe_psql('app', q{ALTER EXTENSION idem UPDATE});
is($node->safe_psql('app', q{SELECT role, tenant FROM idem_binding ORDER BY role::text}),
	"app_acme|acme\napp_db|initech",
	'the upgrade binds the roles that idem.tenant bound in this database');
$node->safe_psql('fresh', q{CREATE EXTENSION idem});

# the same catalog after an upgrade as after a fresh install
my $catalog = q{
	SELECT concat_ws(' ', p.oid::regprocedure, p.prosecdef, p.provolatile,
					 p.proisstrict, p.proconfig, p.proacl)
	  FROM pg_proc p
	 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem%'
	UNION ALL
	SELECT concat_ws(' ', c.relname, c.relkind, c.relrowsecurity, c.relacl)
	  FROM pg_class c
	 WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'idem%'
	UNION ALL
	SELECT concat_ws(' ', polname, polpermissive, polcmd, polroles,
					 pg_get_expr(polqual, polrelid))
	  FROM pg_policy
	UNION ALL
	SELECT concat_ws(' ', tgname, tgenabled, tgtype, tgfoid::regproc)
	  FROM pg_trigger WHERE NOT tgisinternal
	UNION ALL
	SELECT concat_ws(' ', conname, contype, pg_get_constraintdef(oid))
	  FROM pg_constraint WHERE connamespace = 'public'::regnamespace
	UNION ALL
	SELECT concat_ws(' ', extconfig::regclass[], extcondition)
	  FROM pg_extension WHERE extname = 'idem'
	ORDER BY 1};
is($node->safe_psql('app', $catalog), $node->safe_psql('fresh', $catalog),
	'an upgraded 0.1.0 has the catalog of a fresh install');

$node->safe_psql('app', q{
	SELECT idem_claim('acme', 'POST /orders', 'a1');
	SELECT idem_complete('acme', 'POST /orders', 'a1', 201, 'acme order');
	SELECT idem_claim('globex', 'POST /orders', 'g1');
	SELECT idem_complete('globex', 'POST /orders', 'g1', 201, 'globex secret');
	SELECT idem_claim('globex', 'POST /orders', 'g2');
	GRANT SELECT ON idem_record TO app_acme, app_pool, app_definer;
	GRANT EXECUTE ON FUNCTION idem_list(text, text, boolean, integer) TO app_acme, app_definer;
	GRANT EXECUTE ON FUNCTION idem_forget(text, text, text) TO app_acme, app_definer;
	GRANT CREATE ON SCHEMA public TO app_definer;
	SET ROLE app_definer;
	CREATE FUNCTION definer_replay(t text) RETURNS text LANGUAGE sql SECURITY DEFINER
		AS $$ SELECT convert_from(body, 'UTF8') FROM public.idem_replay(t, 'POST /orders', 'g1') $$;
	CREATE FUNCTION definer_rows(t text) RETURNS bigint LANGUAGE sql SECURITY DEFINER
		AS $$ SELECT count(*) FROM public.idem_record WHERE tenant = t $$;
	RESET ROLE;
});

# every call on globex's keys: a refusal is expected of the functions, no
# row of the table read paths (run first in a session, so that one of them
# is the session's first use of idem)
my @refused = (
	q{SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1')},
	q{SELECT outcome FROM idem_claim('globex', 'POST /orders', 'new')},
	q{SELECT outcome FROM idem_claim('globex', 'POST /orders', 'g1', '{"a": 1}'::jsonb)},
	q{SELECT idem_complete('globex', 'POST /orders', 'g2', 200, 'hijack')},
	q{SELECT idem_fail('globex', 'POST /orders', 'g2', 500, 'hijack', retryable => true)},
	q{SELECT idem_release('globex', 'POST /orders', 'g2')},
	q{SELECT convert_from(body, 'UTF8') FROM idem_replay('globex', 'POST /orders', 'g1')},
	q{SELECT convert_from(body, 'UTF8') FROM idem_list('globex', with_body => true)},
	q{SELECT idem_forget('globex', 'POST /orders', 'g1')},
	q{SELECT definer_replay('globex')});
my @no_rows = (
	q{SELECT count(*) FROM idem_record WHERE tenant = 'globex'},
	q{SELECT definer_rows('globex')});

# What a session may do to unbind itself, before idem is loaded in it or
# after; %s is the call, run once per call.
my $load = q{SELECT count(*) FROM idem_replay('acme', 'POST /orders', 'a1');};
my %tampering = (
	'nothing'            => '%s;',
	'SET'                => q{SET idem.tenant = 'globex'; %s;},
	'SET empty'          => q{SET idem.tenant = ''; %s;},
	'SET LOCAL'          => qq{\\set ON_ERROR_ROLLBACK on\nBEGIN; SET LOCAL idem.tenant = ''; %s; ROLLBACK;},
	'RESET'              => q{RESET idem.tenant; RESET ALL; %s;},
	'set_config'         => q{SELECT set_config('idem.tenant', 'globex', false) IS NULL; %s;},
	'SET require_binding'=> q{SET idem.require_binding = off; %s;});

# Run the calls in one session as $user with connection options $options,
# each after $prefix and wrapped by $template; returns a list of problems.
sub check_session
{
	my ($user, $options, $prefix, $template) = @_;
	my $script = "$prefix\n";
	my $i = 0;
	for my $call (@no_rows, @refused)
	{
		$script .= "\\echo ==$i\n\\warn ==$i\n" . sprintf($template, $call) . "\n";
		$i++;
	}
	$script .= "\\echo ==end\n\\warn ==end\n";
	# from a file, not standard input: a session that the server refuses at
	# connection ends psql before it could read a pipe, and writing to it
	# would fail
	my $file = $node->basedir . '/check_session.sql';
	open my $fh, '>', $file or die "cannot write $file: $!";
	print $fh $script;
	close $fh;
	local $ENV{PGOPTIONS} = $options;
	my ($ret, $out, $err) = $node->psql('app', '', on_error_stop => 0,
		extra_params => [ '-U', $user, '-v', 'VERBOSITY=verbose', '-f', $file ]);

	# a connection option that idem refuses ends the session before any call
	return ()
	  if $out eq ''
	  && $err !~ /==0/
	  && $err =~ /FATAL:  (invalid configuration parameter name "idem\.tenant"|permission denied to set parameter "idem\.require_binding")/;
	return ("session failed: $err") if $out !~ /==end/;

	my @problems;
	my @outs = split /^==\S+\n?/m, $out;
	my @errs = split /^==\S+\n?/m, $err;
	for my $n (0 .. $#no_rows + @refused)
	{
		my ($o, $e) = ($outs[ $n + 1 ] // '', $errs[ $n + 1 ] // '');
		my $read = $n <= $#no_rows;
		my $call = $read ? $no_rows[$n] : $refused[ $n - @no_rows ];
		$o =~ s/^(t|f)\n// if $template =~ /set_config/;
		# not preloaded, a refused connection option has replaced the
		# configured idem.require_binding: every call refuses
		# (014_caps_without_preload.pl)
		my $unreadable = $e =~ /ERROR:  42501: idem cannot read the configured value of "idem\.require_binding"/
		  && $options =~ /require_binding/;
		if ($read)
		{
			push @problems, "$call: \"$o\" $e" if $o ne "0\n" && !$unreadable;
		}
		else
		{
			push @problems, "$call: answered \"$o\"" if $o ne '';
			push @problems, "$call: not refused with 42501: $e"
			  if $e !~ /ERROR:  42501: permission denied for idem tenant "globex"/ && !$unreadable;
		}
	}
	return @problems;
}

# Every tampering, before and after idem is loaded, for each way of being
# app_acme.
sub check_all
{
	my ($mode) = @_;
	my @ways = (
		[ 'login as app_acme', 'app_acme', '' ],
		[ 'superuser, SET ROLE app_acme', $node->safe_psql('app', 'SELECT current_user'),
		  'SET ROLE app_acme;' ],
		[ 'app_pool (NOINHERIT), SET ROLE app_acme', 'app_pool', 'SET ROLE app_acme;' ]);
	for my $way (@ways)
	{
		my ($name, $user, $become) = @$way;
		for my $options ('', '-c idem.tenant=globex', '-c idem.tenant=',
			'-c idem.require_binding=off')
		{
			for my $t (sort keys %tampering)
			{
				for my $loaded (0, 1)
				{
					my $prefix = $loaded ? "$become $load" : $become;
					my @p = check_session($user, $options, $prefix, $tampering{$t});
					ok(!@p, "$mode, $name, options \"$options\", $t "
						  . ($loaded ? 'after' : 'before') . ' idem is loaded')
					  or diag(join("\n", @p));
				}
			}
		}
	}
}

check_all('not preloaded');

# the bindings hold across sessions as they change: a session sees a new
# binding at its next transaction
{
	my $super = $node->connstr('app');
	my ($ret, $out, $err) = $node->psql('app', qq{
		SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
		\\! psql -X -q -d "$super" -c "SELECT idem_unbind('app_acme')" >/dev/null
		SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');
		\\! psql -X -q -d "$super" -c "SELECT idem_bind('app_acme', 'acme')" >/dev/null
		SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1');},
		on_error_stop => 0, extra_params => [ '-U', 'app_acme', '-v', 'VERBOSITY=verbose' ]);
	is($out, 'replay', 'an unbinding shows in a running session, and a binding again');
	like($err, qr/ERROR:  42501: permission denied for idem tenant "globex".*\n(.*\n)*.*ERROR:  42501/,
		'refused before the unbinding and after the binding');
}

$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
$node->restart;
check_all('preloaded');

# leftover idem.tenant role settings break no login: they only warn
{
	my ($ret, $out, $err) = $node->psql('app', 'SELECT idem_tenant()',
		extra_params => [ '-U', 'app_db' ]);
	is($out, 'initech', 'a role with a leftover idem.tenant setting logs in');
	like($err, qr/WARNING:  invalid configuration parameter name "idem.tenant"/,
		'with a warning');
}

# PgBouncer in transaction mode, one server connection for every client:
# the pooler's role is unbound and switches with SET LOCAL ROLE
my $bouncer_port = PostgreSQL::Test::Cluster::get_free_port();
my $bouncer_dir = PostgreSQL::Test::Utils::tempdir();
my $host = $node->host;
my $port = $node->port;
open(my $ini, '>', "$bouncer_dir/pgbouncer.ini") or die $!;
print $ini <<"EOF";
[databases]
app = host=$host port=$port dbname=app user=app_pool

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 1
max_client_conn = 10
logfile = $bouncer_dir/pgbouncer.log
pidfile = $bouncer_dir/pgbouncer.pid
EOF
close($ini);
my $bouncer = IPC::Run::start([ '/usr/sbin/pgbouncer', "$bouncer_dir/pgbouncer.ini" ],
	'>', "$bouncer_dir/stdout", '2>', "$bouncer_dir/stderr");

sub through_bouncer
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'psql', '-X', '-A', '-t', '-q', '-v', 'VERBOSITY=verbose',
		'-h', '127.0.0.1', '-p', $bouncer_port, '-U', 'app_pool', '-d', 'app',
		'-c', $sql ], '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	chomp $out;
	return ($out, $err);
}

for (1 .. 50)
{
	($out, $err) = through_bouncer('SELECT 1');
	last if $out eq '1';
	sleep 0.2;
}
is($out, '1', 'PgBouncer runs in front of the server');

for my $set ('SET LOCAL ROLE app_acme;', 'SET ROLE app_acme;')
{
	for my $call (@refused)
	{
		($out, $err) = through_bouncer("BEGIN; $set $call; RESET ROLE; COMMIT;");
		is($out, '', "PgBouncer, $set no answer of $call");
		like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"/, 'refused with 42501');
	}
	for my $call (@no_rows)
	{
		($out, $err) = through_bouncer("BEGIN; $set $call; RESET ROLE; COMMIT;");
		is($out, '0', "PgBouncer, $set no row by $call");
	}
}
($out, $err) = through_bouncer(q{BEGIN; SET LOCAL ROLE app_acme;
	SELECT convert_from(body, 'UTF8') FROM idem_replay('acme', 'POST /orders', 'a1'); COMMIT;});
is($out, 'acme order', 'PgBouncer, SET LOCAL ROLE app_acme: its own tenant replays');
($out, $err) = through_bouncer(q{SELECT current_user, idem_tenant() IS NULL});
is($out, 'app_pool|t', 'the next transaction on the same server connection is the pooler again');

# with idem.require_binding, the unbound pooler itself touches nothing
$node->safe_psql('app', q{ALTER SYSTEM SET idem.require_binding = on; SELECT pg_reload_conf();});
$node->poll_query_until('app', q{SELECT current_setting('idem.require_binding') = 'on'});
($out, $err) = through_bouncer(q{SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1')});
is($out, '', 'require_binding: the unbound pooler gets no answer');
like($err, qr/ERROR:  42501: permission denied for idem tenant "acme"/, 'refused with 42501');
($out, $err) = through_bouncer(q{SELECT count(*) FROM idem_record});
like($err, qr/ERROR:  42501: permission denied for idem tenants/, 'nor reads the table');
($out, $err) = through_bouncer(q{BEGIN; SET LOCAL ROLE app_acme;
	SELECT outcome FROM idem_replay('acme', 'POST /orders', 'a1'); COMMIT;});
is($out, 'replay', 'require_binding: after SET LOCAL ROLE app_acme it works for acme');
$node->safe_psql('app', q{ALTER SYSTEM RESET idem.require_binding; SELECT pg_reload_conf();});
$bouncer->kill_kill;

# pg_dump and pg_restore keep the bindings, by role name; those of roles
# dropped since are left out
$node->safe_psql('app', q{
	CREATE ROLE app_gone;
	SELECT idem_bind('app_gone', 'gone');
	DROP ROLE app_gone;
});
my $dump = "$bouncer_dir/app.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('app') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore');
is($node->safe_psql('restored', q{SELECT role, tenant FROM idem_binding ORDER BY role::text}),
	"app_acme|acme\napp_db|initech", 'the bindings are restored');
($ret, $out, $err) = $node->psql('restored',
	q{SELECT outcome FROM idem_replay('globex', 'POST /orders', 'g1')},
	extra_params => [ '-U', 'app_acme', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"/,
	'and hold in the restored database');

$node->stop;
done_testing();
