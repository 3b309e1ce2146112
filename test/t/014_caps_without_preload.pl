# test/t/014_caps_without_preload.pl: a superuser-only setting of idem
# (idem.max_retention, idem.max_lease, idem.require_binding) binds every
# session, preloaded or not, whatever a client sends.
#
# Not preloaded, idem's settings are placeholders until a session's first
# call loads the library; a connection option of a role that may not set
# them replaces the configuration file's value, and is refused when the
# library defines the variable, which then falls back to its built-in
# default (no cap).  idem notices the lost value and refuses the calls
# that read it (42501), rather than run without the cap.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('caps');
$node->init;
$node->append_conf('postgresql.conf', q{
idem.max_retention = '30d'
idem.max_lease = '1h'
idem.require_binding = on
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE ROLE app LOGIN;
	CREATE ROLE stray LOGIN;
	SELECT idem_bind('app', 'acme');
});

# one new session of role, with the connection options given: (stdout, stderr)
sub session
{
	my ($role, $options, $sql) = @_;
	local $ENV{PGOPTIONS} = $options;
	my ($ret, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 0,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
	return ($out, $err);
}

for my $mode ('not preloaded', 'preloaded')
{
	my ($out, $err);
	if ($mode eq 'preloaded')
	{
		$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem'");
		$node->restart;
	}

	# the configured caps hold
	($out, $err) = session('app', '', q{
		SELECT outcome FROM idem_claim('acme', 'e', 'k0', retention => '31 days');});
	like($err, qr/ERROR:  22023: retention 31 days is longer than idem.max_retention \(30d\)/,
		"$mode: the configured idem.max_retention refuses a longer retention");

	# a connection option of a role that may not set the cap
	($out, $err) = session('app', '-c idem.max_retention=100d', q{
		SELECT outcome FROM idem_claim('acme', 'e', 'k1', retention => '31 days');});
	unlike($out, qr/claimed/, "$mode: -c idem.max_retention does not lift the cap");
	like($err, $mode eq 'preloaded' ?
		qr/permission denied to set parameter "idem.max_retention"/ :
		qr/ERROR:  42501: idem cannot read the configured value of "idem.max_retention"/,
		"$mode: -c idem.max_retention is refused");

	($out, $err) = session('app', '-c idem.max_lease=10h', q{
		SELECT outcome FROM idem_claim('acme', 'e', 'k2', lease => '2 hours');});
	unlike($out, qr/claimed/, "$mode: -c idem.max_lease does not lift the cap");
	like($err, qr/idem.max_lease/, "$mode: -c idem.max_lease is refused, named");

	($out, $err) = session('stray', '-c idem.require_binding=off', q{
		SELECT outcome FROM idem_claim('acme', 'e', 'k3');});
	unlike($out, qr/claimed/, "$mode: -c idem.require_binding=off does not free an unbound role");
	like($err, qr/42501|permission denied to set parameter "idem.require_binding"/,
		"$mode: the unbound role is refused");

	# a SET before the first call: the configuration file's value survives
	# the refused one, and holds
	($out, $err) = session('app', '', q{
		SET idem.max_retention = '100d';
		SELECT outcome FROM idem_claim('acme', 'e', 'k4', retention => '31 days');});
	unlike($out, qr/claimed/, "$mode: SET idem.max_retention does not lift the cap");
	like($err, qr/idem.max_retention/, "$mode: SET idem.max_retention is refused, named");

	# nothing was claimed, and a role that may set the cap still can
	is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_record}), '0',
		"$mode: no record was written");
	($out, $err) = session('postgres', '-c idem.max_retention=100d', q{
		SELECT outcome FROM idem_claim('acme', 'e', 'k5', retention => '31 days');
		SELECT idem_forget('acme', 'e', 'k5');});
	like($out, qr/^claimed/, "$mode: a superuser's connection option sets the cap");
}

$node->stop;
done_testing();
