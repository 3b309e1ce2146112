# test/t/023_binding_discard.pl: the tenant check ends when caches are
# reset at every lock (debug_discard_caches = 1, which test/matrix.sh's 16
# is built to allow; Debian's builds cannot set it, and skip this test).
# The check looks up idem_binding again when an invalidation arrived during
# its look-up (src/tenant.c, role_binding); before 0.4.0 a reset of the
# caches counted as one, and each look-up's catalog locks reset them again:
# the check never ended.  The claim is a bound role's on another tenant,
# refused by the check itself, so that the rest of a claim (minutes with
# every cache reset at each lock) is not waited for.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('discard');
$node->init;
$node->start;
if ($node->safe_psql('postgres',
		q{SELECT max_val FROM pg_settings WHERE name = 'debug_discard_caches'}) eq '0')
{
	$node->stop;
	plan skip_all => 'this server cannot set debug_discard_caches '
	  . '(test/matrix.sh builds its 16 with DISCARD_CACHES_ENABLED)';
}

$node->safe_psql('postgres', q{
	CREATE ROLE app_acme LOGIN;
	CREATE EXTENSION idem;
	SELECT idem_bind('app_acme', 'acme');
});

# a new backend: the first check reads the binding table and its triggers,
# every catalog lock resetting the caches (a hang fails at the timeout)
my ($ret, $out, $err) = $node->psql('postgres', q{
	SET debug_discard_caches = 1;
	SET statement_timeout = '120s';
	SET ROLE app_acme;
	SELECT outcome FROM idem_claim('globex', 'POST /orders', 'k1');
}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"\nDETAIL:  Role "app_acme" is bound to idem tenant "acme"\./,
	'with the caches reset at every lock, the tenant check ends and refuses another tenant by the binding');

# a new backend's second check, after idem_tenant() made the first
($ret, $out, $err) = $node->psql('postgres', q{
	SET debug_discard_caches = 1;
	SET statement_timeout = '120s';
	SET ROLE app_acme;
	SELECT idem_tenant();
	SELECT outcome FROM idem_claim('globex', 'POST /orders', 'k2');
}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
is($out, 'acme', 'the bound role\'s tenant is read under the same resets');
like($err, qr/ERROR:  42501: permission denied for idem tenant "globex"\nDETAIL:  Role "app_acme" is bound to idem tenant "acme"\./,
	'and the backend\'s next check ends and refuses too');

ok(!$node->log_contains('terminated by signal'), 'no backend crashed');

$node->stop;
done_testing();
