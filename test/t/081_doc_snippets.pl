# test/t/081_doc_snippets.pl: the SQL of the documentation runs as written.
#
# Every ```sql block of README.md and doc/*.md is run with psql against a
# server with idem preloaded, the blocks of one file in their order in one
# database (so a block may use what an earlier one made), with
# ON_ERROR_STOP: a block that fails to parse or errors fails here.  A
# block that creates the extension runs in an empty database of its own.
# The psql variables the snippets use (:'key', :'tenant', ...) are set
# below, and the business tables they write (orders, invoices, incoming)
# exist.  A block that is not meant to run says why on the line before it,
# in an HTML comment that a reader of the rendered page does not see:
#
#   <!-- not run: needs Citus; test/citus/041_citus.pl takes these steps -->
#
# and counts as skipped here.
use strict;
use warnings;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = dirname(__FILE__) . '/../..';

my $node = PostgreSQL::Test::Cluster->new('snippets');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = '1h'
});
$node->start;

my %vars = (
	key => 'k-42',
	request => '{"item": "book", "qty": 1}',
	response => '{"id": 7}',
	tenant => 'acme',
	idempotency_key => 'k-43',
	request_body => '{"item": "book", "qty": 1}',
	response_body => '{"id": 8}',
	message_id => 'm-1',
	message_ids => '{m1,m2,m3}');
my $fixtures = q{
	CREATE EXTENSION idem;
	CREATE TABLE orders (id serial PRIMARY KEY, customer text, item text);
	CREATE TABLE invoices (message text, amount integer);
	CREATE TABLE incoming (id text PRIMARY KEY, amount integer);
	INSERT INTO incoming VALUES ('m1', 10), ('m2', 20), ('m3', 30);
};

# the ```sql blocks of a file: [line, text, reason not to run or undef]
sub blocks
{
	my ($file) = @_;
	my (@blocks, $text, $start, $skip, $prev);
	open(my $fh, '<', $file) or die "$file: $!";
	while (my $line = <$fh>)
	{
		if (defined $text)
		{
			if ($line =~ /^```\s*$/)
			{
				push @blocks, [ $start, $text, $skip ];
				undef $text;
			}
			else
			{
				$text .= $line;
			}
		}
		elsif ($line =~ /^```sql\s*$/)
		{
			($text, $start) = ('', $.);
			$skip = defined $prev && $prev =~ /^<!-- not run: (.*?) -->/ ? $1 : undef;
		}
		$prev = $line;
	}
	close($fh);
	return @blocks;
}

my ($ran, $db) = (0, 0);
for my $file ('README.md', map { 'doc/' . $_ } sort map { s{.*/}{}r } glob("$top/doc/*.md"))
{
	my @blocks = blocks("$top/$file");
	next unless @blocks;
	my $dbname = 'snippets_' . ++$db;
	$node->safe_psql('postgres', "CREATE DATABASE $dbname");
	$node->safe_psql($dbname, $fixtures);
	for my $b (@blocks)
	{
		my ($line, $sql, $skip) = @$b;
	  SKIP:
		{
			skip("$file:$line: $skip", 1) if defined $skip;
			my $target = $dbname;
			if ($sql =~ /^\s*CREATE EXTENSION idem\b/m)
			{
				$target = 'snippets_' . ++$db;
				$node->safe_psql('postgres', "CREATE DATABASE $target");
			}
			my ($ret, $out, $err) = $node->psql($target, $sql,
				extra_params => [ '-v', 'ON_ERROR_STOP=1',
					map { ('-v', "$_=$vars{$_}") } sort keys %vars ]);
			ok($ret == 0 && $err !~ /ERROR|error:/, "$file:$line runs")
			  or diag("$sql\n$err");
			$ran++;
		}
	}
}
cmp_ok($ran, '>=', 10, 'the documentation has SQL blocks that ran');

# what the worked examples did, as they say
is($node->safe_psql('snippets_1', q{
	SELECT count(*) FROM orders}), '1', "README's example wrote its order");

done_testing();
