# test/t/013_misspelt_settings.pl: what becomes of a misspelt idem setting
# (idem.leese), with and without idem preloaded, exactly as doc/settings.md
# describes it.
#
# Until a session loads idem's library, PostgreSQL keeps an unknown
# "idem." setting as a placeholder and accepts it.  Loading the library
# reserves the prefix: the placeholder is removed with a WARNING naming it,
# and from then on such a setting is an error.  Preloaded, the library is
# loaded before any session, so a SET is an error at once and a role or
# database setting warns at login and is not in force.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('misspelt');
$node->init;
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idem; CREATE ROLE app_typo LOGIN});

# run a script in one new session: (stdout, stderr)
sub session
{
	my ($sql, @params) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose', @params ]);
	return ($out, $err);
}

for my $mode ('not preloaded', 'preloaded')
{
	my ($out, $err);
	if ($mode eq 'not preloaded')
	{
		# accepted while the library is not loaded in the session...
		($out, $err) = session(q{
			SET idem.leese = '1s';
			SHOW idem.leese;
			SELECT idem_tenant() IS NULL AS first_call;
			SHOW idem.leese;
			SET idem.leese = '1s';});
		like($out, qr/^1s\nt$/, "$mode: SET idem.leese is accepted until the session's first idem call");
		like($err, qr/^psql:<stdin>:4: WARNING:  42602: invalid configuration parameter name "idem.leese", removing it\nDETAIL:  "idem" is now a reserved prefix\.\n/m,
			"$mode: the first idem call (it loads the library) removes it with a WARNING");
		like($err, qr/ERROR:  42704: unrecognized configuration parameter "idem.leese".*ERROR:  42602: invalid configuration parameter name "idem.leese"\nDETAIL:  "idem" is a reserved prefix\./s,
			"$mode: then it is gone, and a new SET is an error");

		# a statement that calls none of idem's C functions (a superuser's
		# query of the table: row-level security does not apply to it)
		# does not load the library, and leaves the placeholder in place
		($out, $err) = session(q{
			SET idem.leese = '1s';
			SELECT count(*) FROM idem_record;
			SHOW idem.leese;});
		is($out, "0\n1s", "$mode: reading idem's table does not load the library: the placeholder stays");
	}
	else
	{
		($out, $err) = session(q{SET idem.leese = '1s'});
		like($err, qr/ERROR:  42602: invalid configuration parameter name "idem.leese"\nDETAIL:  "idem" is a reserved prefix\./,
			"$mode: SET idem.leese is an error");
	}

	# a role setting: set without an error while the library is not loaded
	# in the session that sets it, and removed with a WARNING at login once
	# it is preloaded
	$node->safe_psql('postgres', q{ALTER ROLE app_typo SET idem.leese = '1s'})
	  if $mode eq 'not preloaded';
	($out, $err) = session(q{SHOW idem.leese; SELECT idem_tenant() IS NULL;}, '-U', 'app_typo');
	if ($mode eq 'not preloaded')
	{
		like($out, qr/^1s\nt$/, "$mode: a role setting idem.leese is in force at login");
		like($err, qr/WARNING:  42602: invalid configuration parameter name "idem.leese", removing it/,
			"$mode: until the first idem call removes it with a WARNING");
	}
	else
	{
		like($err, qr/^WARNING:  invalid configuration parameter name "idem.leese"\nDETAIL:  "idem" is a reserved prefix\.\n.*ERROR:  42704: unrecognized configuration parameter "idem.leese"/s,
			"$mode: a role setting idem.leese warns at login, and is not in force");
		is($out, 't', "$mode: the login succeeds");
	}

	if ($mode eq 'not preloaded')
	{
		$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
		$node->restart;
	}
}

$node->stop;
done_testing();
