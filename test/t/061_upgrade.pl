# test/t/061_upgrade.pl: a DBA's upgrade from idem 0.1.0 to the current
# version with ALTER EXTENSION idem UPDATE.
#
# A 0.1.0 install is filled with records in every state and with roles bound
# to tenants the 0.1.0 way, then updated.  Afterwards every record answers
# exactly as before, the bindings hold, the current API works, and the
# updated extension's catalog objects are the same as those of a fresh
# CREATE EXTENSION idem: compared object by object over the extension's
# members, and again over a binary-upgrade pg_dump of each database, so that
# any difference between idem--<version>.sql and the upgrade scripts fails
# here.  Last, a pg_dump of the updated database, and one of the 0.1.0
# database, restore into a fresh install with every record.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The 0.1.0 era runs without idem preloaded, so that the sessions that bind
# roles the 0.1.0 way (a role setting of idem.tenant) never load the
# library installed now, which is the new version's.
my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf', q{idem.purge_interval = '1h'});
$node->start;

my $version = slurp_file(dirname(__FILE__) . '/../../idem.control') =~ /^default_version = '(.*)'/m
	? $1 : die 'no default_version in idem.control';

# The extension lives in a schema of its own in every database here, so that
# an upgrade script that names a schema instead of @extschema@ fails.
for my $db (qw(upgraded fresh))
{
	$node->safe_psql('postgres', qq{
		CREATE DATABASE $db;
		ALTER DATABASE $db SET search_path = public, idem;
	});
	$node->safe_psql($db, 'CREATE SCHEMA idem');
}

#
# 0.1.0, filled the way 0.1.0 was used
#
# roles bound the 0.1.0 way, for every database and for one
$node->safe_psql('postgres', q{
	CREATE ROLE app_acme LOGIN;
	ALTER ROLE app_acme SET idem.tenant = 'acme';
	CREATE ROLE app_globex LOGIN;
	ALTER ROLE app_globex IN DATABASE upgraded SET idem.tenant = 'globex';
});

$node->safe_psql('upgraded', q{CREATE EXTENSION idem SCHEMA idem VERSION '0.1.0'});
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	'0.1.0', 'idem 0.1.0 is installed');

# The records, as rows of 0.1.0's table, the way 0.1.0's library wrote them
# (the library installed now is the new version's, which may need the new
# version's objects): the fingerprint is the SHA-256 of the request (jsonb
# in its canonical text), a jsonb body its canonical text, a release a
# retryable failure without a response, a re-claim the next attempt.  All
# were claimed at $t0 with the default retention of 24 hours.
my $t0 = $node->safe_psql('upgraded', q{SELECT date_trunc('second', now() - interval '1 min')});
$node->safe_psql('upgraded', qq{
	INSERT INTO idem.idem_record (tenant, endpoint, key, state, retryable, fingerprint,
			status, body, attempt, created_at, claimed_at, lease_expires_at, finished_at,
			expires_at)
	SELECT t, e, k, st, r, fp, s, b, a, t0, t0, t0 + lease, f, t0 + interval '24 h'
	  FROM (SELECT '$t0'::timestamptz) AS base(t0),
		   LATERAL (VALUES
		-- succeeded, with a jsonb fingerprint and a binary body
		('acme', 'POST /orders', 'done', 'succeeded', false,
		 sha256(convert_to('{"qty": 1}', 'UTF8')), 201, '\\x00ff7b7d'::bytea, 1,
		 interval '5 min', t0 + interval '1 s'),
		-- succeeded, with a text fingerprint and a jsonb body
		('acme', 'POST /orders', 'json', 'succeeded', false,
		 sha256(convert_to('text request', 'UTF8')), 200,
		 convert_to('{"a": "x", "b": [1, 2]}', 'UTF8'), 1, interval '5 min', t0 + interval '1 s'),
		-- failed, not retryable: replayed
		('acme', 'POST /orders', 'declined', 'failed', false, NULL, 402,
		 convert_to('card declined', 'UTF8'), 1, interval '5 min', t0 + interval '1 s'),
		-- pending within its lease, and pending after its lease ran out
		('acme', 'POST /pay', 'pending', 'pending', false, NULL, NULL, NULL, 1,
		 interval '1 h', NULL),
		('acme', 'POST /pay', 'stale', 'pending', false, NULL, NULL, NULL, 1,
		 interval '1 ms', NULL),
		-- failed retryably: executes again as attempt 2
		('globex', 'POST /orders', 'retry', 'failed', true, NULL, 503,
		 convert_to('later', 'UTF8'), 1, interval '5 min', t0 + interval '1 s'),
		-- released: executes again as attempt 2
		('globex', 'POST /orders', 'released', 'failed', true, NULL, NULL, NULL, 1,
		 interval '5 min', t0 + interval '1 s'),
		-- succeeded on its second attempt
		('globex', 'POST /orders', 'second', 'succeeded', false, NULL, 200,
		 convert_to('ok', 'UTF8'), 2, interval '5 min', t0 + interval '2 s'))
		AS v(t, e, k, st, r, fp, s, b, a, lease, f)
	UNION ALL
	-- a batch of pending claims
	SELECT 'bulk', 'POST /import', 'row-' || i, 'pending', false, NULL, NULL, NULL, 1,
		   t0, t0, t0 + interval '1 h', NULL, t0 + interval '24 h'
	  FROM (SELECT '$t0'::timestamptz) AS base(t0), generate_series(1, 500) i;

	GRANT USAGE ON SCHEMA idem TO app_acme, app_globex;
	GRANT SELECT ON idem.idem_record TO app_acme, app_globex;
});

# What each key answers: outcome, status, body, attempt, and whether the
# record's timestamps come back (a new claim's own are left out).  The
# claims run in a transaction that rolls back, so they change nothing.
my $keys = q{(VALUES (1, 'acme', 'POST /orders', 'done', '{"qty": 1}'::jsonb),
		(2, 'acme', 'POST /orders', 'done', '{"qty": 2}'),
		(3, 'acme', 'POST /orders', 'json', NULL),
		(4, 'acme', 'POST /orders', 'declined', NULL),
		(5, 'acme', 'POST /pay', 'pending', NULL),
		(6, 'acme', 'POST /pay', 'stale', NULL),
		(7, 'globex', 'POST /orders', 'retry', NULL),
		(8, 'globex', 'POST /orders', 'released', NULL),
		(9, 'globex', 'POST /orders', 'second', NULL),
		(10, 'bulk', 'POST /import', 'row-500', NULL),
		(11, 'acme', 'POST /orders', 'new', NULL)) AS v(n, t, e, k, fp)};
sub answer
{
	my ($c) = @_;
	return qq{string_agg(concat_ws(':', n, $c.outcome, coalesce($c.status::text, '-'),
			coalesce(encode($c.body, 'escape'), '-'), $c.attempt,
			CASE WHEN $c.outcome = 'claimed' THEN '-'
				 WHEN $c.created_at = '$t0' AND $c.expires_at = '$t0'::timestamptz + interval '24 h'
				 THEN 'kept' ELSE 'CHANGED' END), ' ' ORDER BY n)};
}
my $claims = 'BEGIN; SELECT ' . answer('c') . " FROM $keys, LATERAL idem_claim(t, e, k, fp) c; ROLLBACK;";
my $replays = 'SELECT ' . answer('r') . " FROM $keys, LATERAL idem_replay(t, e, k) r";
my $expected_claims = join(' ',
	'1:replay:201:\\000\\377{}:1:kept', '2:mismatch:-:-:1:kept',
	'3:replay:200:{"a": "x", "b": [1, 2]}:1:kept', '4:replay:402:card declined:1:kept',
	'5:in_progress:-:-:1:kept', '6:unknown:-:-:1:kept', '7:claimed:-:-:2:-',
	'8:claimed:-:-:2:-', '9:replay:200:ok:2:kept', '10:in_progress:-:-:1:kept',
	'11:claimed:-:-:1:-');
my $expected_replays = join(' ',
	'1:replay:201:\\000\\377{}:1:kept', '2:replay:201:\\000\\377{}:1:kept',
	'3:replay:200:{"a": "x", "b": [1, 2]}:1:kept', '4:replay:402:card declined:1:kept',
	'5:in_progress:-:-:1:kept', '6:unknown:-:-:1:kept', '9:replay:200:ok:2:kept',
	'10:in_progress:-:-:1:kept');
my $records = q{SELECT tenant, endpoint, key, state, retryable, encode(fingerprint, 'hex'),
		   status, encode(body, 'hex'), attempt, created_at, claimed_at,
		   lease_expires_at, finished_at, expires_at
	  FROM idem.idem_record ORDER BY 1, 2, 3};
my %before = (records => $node->safe_psql('upgraded', $records));

# A bound role: its own tenant, and a refusal (42501) for any other, by
# every function and through the table.
sub check_binding
{
	my ($db, $role, $own, $other, $when) = @_;
	my $connstr = $node->connstr($db) . " user=$role";
	my ($ret, $out, $err) = $node->psql($db,
		qq{BEGIN; SELECT outcome FROM idem_claim('$own', 'POST /orders', 'by-$role'); ROLLBACK;},
		connstr => $connstr);
	is($out, 'claimed', "$when: $role claims for its tenant $own");
	for my $call (
		qq{SELECT idem_claim('$other', 'POST /orders', 'x')},
		qq{SELECT * FROM idem_replay('$other', 'POST /orders', 'retry')},
		qq{SELECT idem_complete('$other', 'POST /orders', 'x', 200, 'x')},
		qq{SELECT idem_fail('$other', 'POST /orders', 'x', 500, 'x', true)},
		qq{SELECT idem_release('$other', 'POST /orders', 'x')})
	{
		($ret, $out, $err) = $node->psql($db, $call, connstr => $connstr,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		like($err, qr/ERROR:  42501: .*"$other"/,
			"$when: $role is refused $call");
	}
	($ret, $out, $err) = $node->psql($db,
		qq{SELECT count(*) FILTER (WHERE tenant <> '$own'), count(*) > 0 FROM idem.idem_record},
		connstr => $connstr);
	is($out, '0|t', "$when: $role reads only its tenant's rows in idem_record");
}

# a dump of the 0.1.0 database, to restore where only the new version is
my $dump_010 = $node->basedir . '/upgraded-0.1.0.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump_010, '-d', $node->connstr('upgraded') ],
	'pg_dump of the 0.1.0 database');

#
# The new package is installed and the server restarted with idem preloaded;
# until ALTER EXTENSION idem UPDATE, the new library refuses every call that
# reaches idem's tables in the 0.1.0 database, in one place and one way
# (idem_extension_schema): 55000, with the hint that mends it.  The
# counters, which read no table, still answer.
#
$node->append_conf('postgresql.conf', q{shared_preload_libraries = 'idem'});
$node->restart;
for my $call (
	q{SELECT * FROM idem_claim('acme', 'POST /orders', 'done')},
	q{SELECT * FROM idem_claim('acme', 'POST /orders', 'between')},
	q{SELECT * FROM idem_replay('acme', 'POST /orders', 'done')},
	q{SELECT idem_complete('acme', 'POST /pay', 'pending', 200, 'x')},
	q{SELECT idem_fail('acme', 'POST /pay', 'pending', 500, 'x', true)},
	q{SELECT idem_release('acme', 'POST /pay', 'pending')},
	q{SELECT count(*) FROM idem_list('acme')},
	q{SELECT idem_purge()})
{
	my ($ret, $out, $err) = $node->psql('upgraded',
		"\\set VERBOSITY verbose\nBEGIN; $call; ROLLBACK;");
	like($err, qr/ERROR:  55000: extension "idem" is at version 0\.1\.0 in this database, older than this library serves.*HINT:  Run ALTER EXTENSION idem UPDATE in this database\./s,
		"before the update: $call is refused, with the hint");
}
is(($node->psql('upgraded', 'SELECT count(*) FROM idem_stats'))[0], 0,
	'before the update: the counters answer');
is($node->safe_psql('upgraded', $records), $before{records},
	'before the update: no record changed');

#
# the update
#
$node->safe_psql('upgraded', 'ALTER EXTENSION idem UPDATE');
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$version, "ALTER EXTENSION idem UPDATE reaches $version");

is($node->safe_psql('upgraded', $claims), $expected_claims,
	'updated: every claim answers as 0.1.0 did, timestamps included');
is($node->safe_psql('upgraded', $replays), $expected_replays,
	'updated: every idem_replay answers as 0.1.0 did');
is($node->safe_psql('upgraded', $records), $before{records},
	'updated: every record keeps its columns');
check_binding('upgraded', 'app_acme', 'acme', 'globex', 'updated');
check_binding('upgraded', 'app_globex', 'globex', 'acme', 'updated');

# the triggers that the tenant binding's cache, the restore of bindings and
# the fencing floor rest on fire whatever a session sets
# (session_replication_role = replica too)
my $triggers = q{SELECT string_agg(tgname || '=' || tgenabled::text, ' ' ORDER BY tgname)
	  FROM pg_trigger WHERE NOT tgisinternal
	   AND tgrelid IN ('idem.idem_binding'::regclass, 'idem.idem_record'::regclass)};
is($node->safe_psql('upgraded', $triggers), 'idem_binding_changed=A idem_binding_unknown_role=A idem_record_forgotten=A',
	'updated: the binding and fencing-floor triggers are enabled ALWAYS');

#
# ---- what the current version adds: the new functions and arguments ----
#
# check_current_api runs in the updated database here and in the fresh one
# below.  Extend it with every function, argument or column the version
# adds, so that each is shown to work after an upgrade as after a fresh
# install.
sub check_current_api
{
	my ($db) = @_;
	is( $node->safe_psql($db, q{
		SELECT c.outcome, c.attempt
		  FROM idem_claim(tenant => 'acme', endpoint => 'POST /api', key => 'k1',
						  fingerprint => 'req', wait => false, lease => '10 min') c;
		SELECT 'completed' FROM idem_complete(tenant => 'acme', endpoint => 'POST /api', key => 'k1',
											  status => 201, body => 'made', attempt => 1);
		SELECT r.outcome, r.status, convert_from(r.body, 'UTF8') FROM idem_replay('acme', 'POST /api', 'k1') r;
	}), "claimed|1\ncompleted\nreplay|201|made", "$db: claim and complete with every argument named");
	my ($ret, $out, $err) = $node->psql($db, q{
		SELECT idem_claim('acme', 'POST /api', 'k2');
		SELECT idem_complete('acme', 'POST /api', 'k2', 200, 'x', attempt => 2);
	}, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  55000/, "$db: a stale attempt is fenced off");
	is( $node->safe_psql($db, q{
		SELECT 'failed' FROM idem_fail('acme', 'POST /api', 'k2', 503, 'x'::bytea, retryable => true, attempt => 1);
		SELECT outcome, attempt FROM idem_claim('acme', 'POST /api', 'k2');
		SELECT idem_release('acme', 'POST /api', 'k2', attempt => 2);
		SELECT count(*) FROM idem_list('acme', 'POST /api', with_body => true, max_rows => 10);
		SELECT idem_forget('acme', 'POST /api', 'k1');
		SELECT idem_purge() >= 0;
		SELECT claims_claimed > 0 FROM idem_stats WHERE datname = current_database();
	}), "failed\nclaimed|2\nt\n2\nt\nt\nt", "$db: fail, release, list, forget, purge and the counters");
	is( $node->safe_psql($db, q{
		SELECT string_agg(key || ':' || outcome || ':' || attempt, ' ')
		  FROM idem_claim_many(tenant => 'acme', endpoint => 'POST /batch', keys => ARRAY['b1', 'b2'],
							   fingerprints => ARRAY['x', 'y']::bytea[], lease => '10 min',
							   retention => '2 days');
		SELECT idem_complete_many(tenant => 'acme', endpoint => 'POST /batch', keys => ARRAY['b1'],
								  statuses => ARRAY[201], bodies => ARRAY['made']::bytea[],
								  attempts => ARRAY[1], headers => ARRAY['{"Location": "/b1"}']::jsonb[]);
		SELECT idem_fail_many(tenant => 'acme', endpoint => 'POST /batch', keys => ARRAY['b2'],
							  statuses => ARRAY[503], bodies => NULL, retryable => true,
							  attempts => ARRAY[1], headers => NULL);
		SELECT string_agg(key || ':' || outcome || ':' || attempt, ' ')
		  FROM idem_claim_many('acme', 'POST /batch', ARRAY['b1', 'b2'], ARRAY['x', 'y']::text[]);
		SELECT string_agg(key || ':' || outcome, ' ')
		  FROM idem_claim_many('acme', 'POST /batch', ARRAY['b1'], ARRAY['{"a": 1}'::jsonb]);
	}), "b1:claimed:1 b2:claimed:1\n1\n1\nb1:replay:1 b2:claimed:2\nb1:mismatch",
		"$db: the batch calls, every argument named, and their overloads");
}
check_current_api('upgraded');
# ---- end of what the current version adds ----

#
# a fresh install has the same catalog objects as the updated one
#
$node->safe_psql('fresh', q{
	CREATE EXTENSION idem SCHEMA idem;
	-- the DBA's grants, as in the updated database
	GRANT USAGE ON SCHEMA idem TO app_acme, app_globex;
	GRANT SELECT ON idem.idem_record TO app_acme, app_globex;
});
check_current_api('fresh');

# Every member of the extension, described by what it is, never by OID:
# functions by their full definition, relations by their columns, options,
# constraints, indexes, triggers, policies and rules, with owners, ACLs,
# initial privileges and comments, and the extension's own row.
my $catalog = q{
SET search_path = pg_catalog, pg_temp;
WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'idem'),
member AS (
	SELECT d.classid, d.objid, d.objsubid
	  FROM pg_depend d, ext
	 WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
	   AND d.deptype = 'e'),
rel AS (
	SELECT c.* FROM pg_class c JOIN member m
		ON m.classid = 'pg_class'::regclass AND m.objid = c.oid),
line(l) AS (
	SELECT format('extension %s %s schema=%s relocatable=%s config=%s conditions=%s owner=%s comment=%s',
				  extname, extversion, extnamespace::regnamespace, extrelocatable,
				  extconfig::regclass[], extcondition, extowner::regrole,
				  obj_description(ext.oid, 'pg_extension'))
	  FROM ext
	UNION ALL
	SELECT 'member ' || pg_describe_object(classid, objid, objsubid) ||
		   ' = ' || (pg_identify_object_as_address(classid, objid, objsubid)).object_names::text
	  FROM member
	UNION ALL
	SELECT format('function %s owner=%s acl=%s comment=%s%s%s', p.oid::regprocedure,
				  p.proowner::regrole, p.proacl, obj_description(p.oid, 'pg_proc'),
				  E'\n', CASE WHEN p.prokind IN ('f', 'p', 'w') THEN pg_get_functiondef(p.oid)
							  ELSE format('aggregate %s %s', p.prokind, p.prosrc) END)
	  FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
	UNION ALL
	SELECT format('relation %s kind=%s persistence=%s owner=%s acl=%s options=%s rls=%s force_rls=%s replident=%s am=%s comment=%s',
				  c.oid::regclass, c.relkind, c.relpersistence, c.relowner::regrole, c.relacl,
				  c.reloptions, c.relrowsecurity, c.relforcerowsecurity, c.relreplident,
				  (SELECT amname FROM pg_am WHERE oid = c.relam), obj_description(c.oid, 'pg_class'))
	  FROM rel c
	UNION ALL
	SELECT format('column %s.%s position=%s type=%s notnull=%s default=%s collation=%s identity=%s generated=%s storage=%s compression=%s options=%s acl=%s comment=%s',
				  a.attrelid::regclass, a.attname,
				  row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
				  format_type(a.atttypid, a.atttypmod), a.attnotnull,
				  pg_get_expr(ad.adbin, ad.adrelid),
				  (SELECT collname FROM pg_collation WHERE oid = a.attcollation),
				  a.attidentity, a.attgenerated, a.attstorage, a.attcompression,
				  (SELECT array_agg(o ORDER BY o) FROM unnest(a.attoptions) o
					WHERE o NOT LIKE 'pg\_attver=%'), a.attacl, col_description(a.attrelid, a.attnum))
	  FROM pg_attribute a JOIN rel c ON c.oid = a.attrelid
	  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	 WHERE a.attnum > 0 AND NOT a.attisdropped
	-- (some builds keep a per-database pg_attver in attoptions: left out)
	UNION ALL
	SELECT format('constraint %s on %s: %s deferrable=%s deferred=%s validated=%s comment=%s',
				  co.conname, co.conrelid::regclass, pg_get_constraintdef(co.oid),
				  co.condeferrable, co.condeferred, co.convalidated,
				  obj_description(co.oid, 'pg_constraint'))
	  FROM pg_constraint co JOIN rel c ON c.oid = co.conrelid
	UNION ALL
	SELECT format('index %s: %s primary=%s clustered=%s replident=%s comment=%s',
				  i.indexrelid::regclass, pg_get_indexdef(i.indexrelid), i.indisprimary,
				  i.indisclustered, i.indisreplident, obj_description(i.indexrelid, 'pg_class'))
	  FROM pg_index i JOIN rel c ON c.oid = i.indrelid
	UNION ALL
	SELECT format('trigger %s on %s: %s enabled=%s', t.tgname, t.tgrelid::regclass,
				  pg_get_triggerdef(t.oid), t.tgenabled)
	  FROM pg_trigger t JOIN rel c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal
	UNION ALL
	SELECT format('policy %s on %s: cmd=%s permissive=%s roles=%s using=%s check=%s',
				  po.polname, po.polrelid::regclass, po.polcmd, po.polpermissive,
				  (SELECT array_agg(CASE r WHEN 0 THEN 'public' ELSE r::regrole::text END ORDER BY 1)
					 FROM unnest(po.polroles) r),
				  pg_get_expr(po.polqual, po.polrelid), pg_get_expr(po.polwithcheck, po.polrelid))
	  FROM pg_policy po JOIN rel c ON c.oid = po.polrelid
	UNION ALL
	SELECT format('rule %s on %s: %s', r.rulename, r.ev_class::regclass, pg_get_ruledef(r.oid))
	  FROM pg_rewrite r JOIN rel c ON c.oid = r.ev_class
	UNION ALL
	SELECT format('statistics %s', pg_get_statisticsobjdef(s.oid))
	  FROM pg_statistic_ext s JOIN rel c ON c.oid = s.stxrelid
	UNION ALL
	SELECT format('sequence %s: %s %s %s %s %s %s %s', sq.seqrelid::regclass, sq.seqtypid::regtype,
				  sq.seqstart, sq.seqincrement, sq.seqmax, sq.seqmin, sq.seqcache, sq.seqcycle)
	  FROM pg_sequence sq JOIN rel c ON c.oid = sq.seqrelid
	UNION ALL
	SELECT format('type %s type=%s owner=%s acl=%s comment=%s', t.oid::regtype, t.typtype,
				  t.typowner::regrole, t.typacl, obj_description(t.oid, 'pg_type'))
	  FROM pg_type t JOIN member m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
	UNION ALL
	SELECT format('initial privileges of %s: %s %s', pg_describe_object(ip.classoid, ip.objoid, ip.objsubid),
				  ip.privtype, ip.initprivs)
	  FROM pg_init_privs ip JOIN member m ON m.classid = ip.classoid AND m.objid = ip.objoid
)
SELECT l FROM line ORDER BY l COLLATE "C"};

# a pg_dump that, unlike a normal one, writes every member of an extension,
# less what differs between any two databases: OIDs, transaction ids,
# dropped columns (invisible to any query) and the database's name
sub member_dump
{
	my ($db) = @_;
	my $file = $node->basedir . "/$db-binary-upgrade.sql";
	# planner statistics (which 18 and later can dump) are data, not schema
	my @no_stats = `pg_dump --help` =~ /--no-statistics/ ? ('--no-statistics') : ();
	$node->command_ok(
		[ 'pg_dump', '--schema-only', '--binary-upgrade', @no_stats, '-f', $file,
		  '-d', $node->connstr($db) ],
		"pg_dump --binary-upgrade of $db");
	my @statements = grep {
		!/binary_upgrade_set_next_|relfrozenxid|relminmxid|datfrozenxid|pg\.dropped/
	} split /;\n/, slurp_file($file);
	my $dump = join(";\n", @statements);
	$dump =~ s/^--.*\n//mg;
	$dump =~ s/^\\(un)?restrict .*\n//mg;
	# the configuration tables' OIDs (the catalog query names them)
	$dump =~ s/(binary_upgrade_create_empty_extension\(.*?)'\{[0-9,]+\}'/$1'{OIDS}'/g;
	$dump =~ s/\b$db\b/DBNAME/g;
	$dump =~ s/\n{2,}/\n/g;
	return $dump;
}

# The comparison, with a diff on failure so the difference shows at once.
sub same_text
{
	my ($got, $want, $name) = @_;
	return pass($name) if $got eq $want;
	my $dir = tempdir(CLEANUP => 1);
	PostgreSQL::Test::Utils::append_to_file("$dir/fresh", $want);
	PostgreSQL::Test::Utils::append_to_file("$dir/updated", $got);
	diag(scalar `diff -u $dir/fresh $dir/updated`);
	return fail($name);
}

my $fresh_catalog = $node->safe_psql('fresh', $catalog);
cmp_ok(scalar(() = $fresh_catalog =~ /^function /mg), '>=', 10,
	'the catalog query sees the functions');
like($fresh_catalog, qr/^column idem\.idem_record\.tenant position=1 type=text notnull=t default= collation=C /m,
	'the catalog query sees the columns');
like($fresh_catalog, qr/^policy idem_record_tenant on idem\.idem_record: /m,
	'the catalog query sees the policies');
like($fresh_catalog, qr/^index idem\.idem_record_key: CREATE UNIQUE INDEX /m,
	'the catalog query sees the indexes');
same_text($node->safe_psql('upgraded', $catalog), $fresh_catalog,
	'the updated extension has the catalog objects of a fresh install');
my $fresh_dump = member_dump('fresh');
like($fresh_dump, qr/ALTER EXTENSION idem ADD FUNCTION idem\.idem_claim\(/,
	'the binary-upgrade dump lists the members');
like($fresh_dump, qr/ALTER TABLE (ONLY )?idem\.idem_binding ENABLE ALWAYS TRIGGER idem_binding_changed;.*ALTER TABLE (ONLY )?idem\.idem_record ENABLE ALWAYS TRIGGER idem_record_forgotten;/s,
	'the binary-upgrade dump (pg_upgrade) keeps the triggers enabled ALWAYS');
same_text(member_dump('upgraded'), $fresh_dump,
	'and the same binary-upgrade pg_dump, member by member');

#
# pg_dump of the updated database restores into a fresh install
#
my $dump = $node->basedir . '/upgraded.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('upgraded') ],
	'pg_dump of the updated database');
$node->safe_psql('postgres', q{
	CREATE DATABASE restored;
	ALTER DATABASE restored SET search_path = public, idem;
});
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database');
is($node->safe_psql('restored', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$version, "the restore installs idem $version afresh");
my $all_records = q{SELECT to_jsonb(r) FROM idem.idem_record r ORDER BY tenant, endpoint, key};
is($node->safe_psql('restored', $all_records), $node->safe_psql('upgraded', $all_records),
	'every record is restored, every column as it was');
is($node->safe_psql('restored', $claims), $expected_claims,
	'and answers as before');
same_text($node->safe_psql('restored', $catalog), $fresh_catalog,
	'the restored extension has the catalog objects of a fresh install');
is($node->safe_psql('restored', $triggers), 'idem_binding_changed=A idem_binding_unknown_role=A idem_record_forgotten=A',
	'the restore recreates the triggers enabled ALWAYS');

# and a 0.1.0 dump restores into a fresh install too (a move to a new
# server): the new columns take their defaults
$node->safe_psql('postgres', q{
	CREATE DATABASE restored_010;
	ALTER DATABASE restored_010 SET search_path = public, idem;
});
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored_010'), $dump_010 ],
	'pg_restore of the 0.1.0 dump into a new database');
is($node->safe_psql('restored_010', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}),
	$version, "the restore of the 0.1.0 dump installs idem $version");
is($node->safe_psql('restored_010', $records), $before{records},
	'every 0.1.0 record is restored as it was');
is($node->safe_psql('restored_010', $claims), $expected_claims,
	'and every claim answers as before');

unlike(slurp_file($node->logfile), qr/was terminated by signal|PANIC/,
	'no server process crashed');
$node->stop;
done_testing();
