# test/t/012_encoding.pl: text and jsonb fingerprints are digested over
# UTF-8 whatever the database encoding, so a record dumped from a UTF8
# database and restored into a LATIN1 one still replays to its retry.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('encoding');
$node->init;
$node->start;

# "é" in the database encoding, and the request bodies that carry it
my $e_acute = q{convert_from('\xc3a9', 'UTF8')};
my $text_fp = "'caf' || $e_acute";
my $jsonb_fp = "jsonb_build_object('name', $e_acute, 'qty', 1)";

for my $enc (qw(UTF8 LATIN1))
{
	my $db = lc($enc) . '_db';
	$node->safe_psql('postgres',
		"CREATE DATABASE $db ENCODING '$enc' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'");
	$node->safe_psql($db, 'CREATE EXTENSION idem');
	$node->safe_psql($db, qq{
		SELECT idem_claim('t', 'e', 'text', $text_fp);
		SELECT idem_complete('t', 'e', 'text', 201, 'text made');
		SELECT idem_claim('t', 'e', 'jsonb', $jsonb_fp);
		SELECT idem_complete('t', 'e', 'jsonb', 201, 'jsonb made');
	});
	is( $node->safe_psql($db, qq{
			SELECT key, fingerprint = CASE key
				WHEN 'text' THEN sha256(convert_to($text_fp, 'UTF8'))
				ELSE sha256(convert_to(($jsonb_fp)::text, 'UTF8')) END
			  FROM idem_record ORDER BY key}),
		"jsonb|t\ntext|t", "$enc: text and jsonb fingerprints are SHA-256 of UTF-8");
}

# dump the UTF8 database, restore it into a LATIN1 one: retries replay
my $dump = $node->basedir . '/utf8.sql';
$node->command_ok([ 'pg_dump', '-d', $node->connstr('utf8_db'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres',
	"CREATE DATABASE restored ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'");
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'),
		'-f', $dump ], 'restore into a LATIN1 database');
is( $node->safe_psql('restored', qq{
		SELECT string_agg(c.outcome || ' ' || convert_from(c.body, 'UTF8'), ', ' ORDER BY k)
		  FROM (VALUES ('text'), ('jsonb')) v(k),
			   LATERAL (SELECT * FROM idem_claim('t', 'e', 'text', $text_fp) WHERE k = 'text'
						UNION ALL
						SELECT * FROM idem_claim('t', 'e', 'jsonb', $jsonb_fp) WHERE k = 'jsonb') c}),
	'replay jsonb made, replay text made',
	'the retries of restored records replay in a LATIN1 database');
is($node->safe_psql('restored', qq{SELECT outcome FROM idem_replay('t', 'e', 'text', $text_fp)}),
	'replay', 'and idem_replay agrees');

$node->stop;
done_testing();
