# test/t/007_hostile_input.pl: a randomized barrage of hostile calls.  Every
# function gets NULLs, empty and 1 MB strings, control characters, invalid
# UTF-8, status extremes, huge bodies, odd leases and odd settings.  Every
# call must either follow the contract or raise an ERROR with a SQLSTATE
# (never an internal error), the server never restarts, and the records of
# keys the barrage never names stay byte for byte as they were.
# The seed is printed; IDEM_FUZZ_SEED=<seed> replays a run.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seed = $ENV{IDEM_FUZZ_SEED} // (time() ^ $$) % 1000000;
srand($seed);
note("seed: $seed (IDEM_FUZZ_SEED=$seed replays this run)");
my $calls = 3000;

my $node = PostgreSQL::Test::Cluster->new('hostile');
$node->init;
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'
lock_timeout = '1s'});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	SELECT idem_claim('guard', 'e', 'done', 'fp');
	SELECT idem_complete('guard', 'e', 'done', 201, '\x00ff'::bytea);
	SELECT idem_claim('guard', 'e', 'pending');
	SELECT idem_claim('guard', 'e', 'failed');
	SELECT idem_fail('guard', 'e', 'failed', 503, 'x', retryable => true);
});
my $guard = q{SELECT md5(string_agg(r::text, ',' ORDER BY key)) FROM idem_record r WHERE tenant = 'guard'};
my $guard_before = $node->safe_psql('postgres', $guard);
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

sub pick { return $_[ int(rand(@_)) ] }

# tenants, endpoints and keys: a small pool, so that records change state,
# and hostile values (never 'guard')
sub name
{
	return pick(
		q{'t1'}, q{'t2'}, q{'k1'}, q{'k2'}, q{'k3'}, q{'e'},
		q{'t1'}, q{'t2'}, q{'k1'}, q{'k2'}, q{'k3'}, q{'e'},
		q{'t1'}, q{'t2'}, q{'k1'}, q{'k2'}, q{'k3'}, q{'e'}, 'NULL', q{''},
		q{repeat('x', 255)}, q{repeat('x', 256)}, q{repeat('é', 128)},
		q{repeat('y', 1048576)}, q{E'\\x01\\x02\\x7f\\t\\n\\r'}, q{'guard '},
		q{convert_from('\\xff'::bytea, 'UTF8')}, q{'ﬀ' || chr(1114111)});
}
sub status { return pick('NULL', '-2147483648', '0', '99', '100', '200', '599', '600', '2147483647') }
sub body
{
	return pick('NULL', q{''::bytea}, q{'\\x00ff'::bytea}, q{'text body'},
		q{'{"a": [1, 2]}'::jsonb}, q{repeat('z', 1048577)}, q{convert_to(repeat('z', 2000000), 'UTF8')},
		q{'\\xfffe80'::bytea}, q{to_jsonb(repeat('j', 1048576))});
}
sub fingerprint
{
	return pick('NULL', q{'req'}, q{'req'::bytea}, q{'{"b": 1, "a": 2}'::jsonb},
		q{'{"a": 2, "b": 1}'::jsonb}, q{'\\xff'::bytea}, q{repeat('f', 1048576)}, q{'null'::jsonb});
}
sub attempt { return pick('NULL', '-1', '0', '1', '2', '3', '2147483647') }
sub bool { return pick('NULL', 'true', 'false') }
sub lease
{
	return pick('NULL', q{'0'}, q{'-1 s'}, q{'1 microsecond'}, q{'1 hour'}, q{'1000 years'},
		q{'infinity'}, q{'-infinity'}, q{'1 mon'});
}
# bounded: a waiting claim of a key this script claimed earlier would
# otherwise wait for the claim's whole lease
sub wait_timeout { return pick(q{'0'}, q{'10 ms'}, q{'-1 s'}) }
sub setting
{
	my $name = pick('idem.retention', 'idem.retry_window', 'idem.lease', 'idem.max_body_size',
		'idem.purge_batch', 'idem.require_binding', 'idem.standby_replay');
	my $value = pick(q{'0'}, q{'-5'}, q{'1s'}, q{'1h'}, q{'25h'}, q{'1000000000d'}, q{'abc'},
		q{'1kB'}, q{'2GB'}, q{''}, 'NULL', q{repeat('v', 300)});
	return "SELECT set_config('$name', $value, false)";
}

my @sql = (q{CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE r text;
BEGIN
	EXECUTE q INTO r;
	IF q LIKE 'SELECT set_config%' THEN
		RETURN 'ok:set ' || coalesce(r, '');
	END IF;
	RETURN 'ok:' || coalesce(r, '');
EXCEPTION WHEN OTHERS THEN
	RETURN 'err:' || SQLSTATE;
END $f$;});
for (1 .. $calls)
{
	my ($t, $e, $k) = (name(), name(), name());
	my $q = pick(
		"SELECT outcome FROM idem_claim($t, $e, $k, " . fingerprint() . ', ' . bool() . ', ' . lease() . '::interval, '
		  . wait_timeout() . '::interval)',
		"SELECT outcome FROM idem_claim($t, $e, $k)",
		"SELECT idem_complete($t, $e, $k, " . status() . ', ' . body() . ', ' . attempt() . ')::text',
		"SELECT idem_fail($t, $e, $k, " . status() . ', ' . body() . ', ' . bool() . ', ' . attempt() . ')::text',
		"SELECT idem_release($t, $e, $k, " . attempt() . ')::text',
		"SELECT outcome FROM idem_replay($t, $e, $k)",
		"SELECT count(*)::text FROM idem_list($t, $e, " . bool() . ', ' . pick('NULL', '-1', '0', '5') . ')',
		"SELECT idem_forget($t, $e, $k)::text",
		'SELECT idem_purge()::text',
		setting(),
		q{SELECT set_config('idem.retention', '1d', false) || set_config('idem.retry_window', '1h', false)
			|| set_config('idem.require_binding', 'off', false) || set_config('idem.max_body_size', '1MB', false)});
	(my $quoted = $q) =~ s/'/''/g;
	push @sql, "SELECT pg_temp.try('$quoted');";
}
my $results = $node->safe_psql('postgres', join("\n", @sql));
my @lines = split(/\n/, $results);
my (%seen, @bad);
for my $line (@lines)
{
	$seen{$line}++;
	push @bad, $line
	  unless $line =~ /^ok:(claimed|replay|in_progress|mismatch|unknown|true|false|\d*)$/
	  || $line =~ /^ok:set /
	  || ($line =~ /^err:([0-9A-Z]{5})$/ && $1 !~ /^(XX|58|57|53)/);
}
is(scalar(@lines), $calls, "all $calls calls answered");
is_deeply(\@bad, [], 'each followed the contract or raised a clean ERROR with a SQLSTATE');
note(join("\n", map { sprintf('%6d %s', $seen{$_}, $_) } sort keys %seen));
cmp_ok(scalar(grep { /^ok:claimed$/ } @lines), '>', 0, 'some claims got through');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'the server never restarted');
is($node->safe_psql('postgres', $guard), $guard_before,
	'records of untouched keys are byte-identical');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_record
	WHERE octet_length(tenant) > 255 OR tenant = '' OR status NOT BETWEEN 100 AND 599}),
	'0', 'no record holds a value the contract refuses');

$node->stop;
done_testing();
