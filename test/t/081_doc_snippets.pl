# test/t/081_doc_snippets.pl: the SQL of the documentation runs as written.
#
# Every ```sql block of README.md and doc/*.md, indented ones (in a list)
# included, runs with psql in a session like the one "make run" leaves: a
# server with idem preloaded and nothing else set, the superuser connected
# to a database in which test/demo.sql ran (idem, the table orders, the
# demo's records).  Each page gets a fresh such database and one psql
# session, under ON_ERROR_STOP, in which its blocks run in the page's
# order: a block may use what make run's demo made and what an earlier
# block of its page made (tables, \set and \gset variables), nothing else.
# No table, variable or role is set up here.  A block that errors fails
# here, and so does every block after it on its page.
#
# A block that creates the extension is the installation's, for a database
# of the reader's: it runs in an empty database of its own.  A block that
# cannot run on make run's server says so on its first line, which the
# reader sees:
#
#   -- not runnable with make run: needs Citus (test/citus/041_citus.pl runs these steps)
#
# and counts as skipped here.
use strict;
use warnings;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = dirname(__FILE__) . '/../..';

# the server of test/demo.sh: idem preloaded, no other setting of idem's
my $node = PostgreSQL::Test::Cluster->new('snippets');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem'\n");
$node->start;

my $demo = slurp_file("$top/test/demo.sql");

# a new database as make run leaves its database idem
sub demo_database
{
	my ($name) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $name");
	my ($ret, $out, $err) = $node->psql($name, $demo, on_error_stop => 1);
	die "test/demo.sql failed in $name: $err" if $ret != 0;
}

# the ```sql blocks of a file: [line, text, reason not to run or undef]
sub blocks
{
	my ($file) = @_;
	my (@blocks, $text, $start, $indent);
	open(my $fh, '<', $file) or die "$file: $!";
	while (my $line = <$fh>)
	{
		if (defined $text)
		{
			if ($line =~ /^\s*```\s*$/)
			{
				my $skip = $text =~ /\A\s*--\s*not runnable with make run:\s*(.+?)\s*$/m ? $1 : undef;
				push @blocks, [ $start, $text, $skip ];
				undef $text;
			}
			else
			{
				$line =~ s/^ {0,$indent}//;
				$text .= $line;
			}
		}
		elsif ($line =~ /^( *)```sql\s*$/)
		{
			($text, $start, $indent) = ('', $., length($1));
		}
	}
	close($fh);
	die "$file: a ```sql block is not closed" if defined $text;
	return @blocks;
}

my ($ran, $db) = (0, 0);
my %db_of;
for my $file ('README.md', map { 'doc/' . $_ } sort map { s{.*/}{}r } glob("$top/doc/*.md"))
{
	my @blocks = blocks("$top/$file");
	next unless @blocks;
	my $dbname = 'snippets_' . ++$db;
	$db_of{$file} = $dbname;
	demo_database($dbname);

	# the page's session: each block after a marker on stderr, which
	# splits psql's messages by block
	my (@session, $script);
	for my $b (@blocks)
	{
		my ($line, $sql, $skip) = @$b;
		next if defined $skip;
		if ($sql =~ /^\s*CREATE EXTENSION idem\b/m)
		{
			my $target = 'snippets_' . ++$db;
			$node->safe_psql('postgres', "CREATE DATABASE $target");
			my ($ret, $out, $err) = $node->psql($target, $sql, on_error_stop => 1);
			$b->[3] = $ret == 0 && $err !~ /ERROR|error:/ ? '' : "$err\n(exit $ret)";
			next;
		}
		push @session, $b;
		$script .= "\\warn <<block $#session>>\n$sql";
	}
	if (@session)
	{
		$script .= "\\warn <<end>>\n";
		my ($ret, $out, $err) = $node->psql($dbname, $script, on_error_stop => 1);
		my ($cur, $end, %said) = (-1, 0);
		for my $l (split /\n/, $err)
		{
			if ($l =~ /^<<block (\d+)>>$/)
			{
				$cur = $1;
				$said{$cur} = '';
			}
			elsif ($l eq '<<end>>')
			{
				$end = 1;
			}
			elsif (defined $cur)
			{
				$said{$cur} .= "$l\n";
			}
		}
		for my $i (0 .. $#session)
		{
			my $said = $said{$i};
			if (!defined $said)
			{
				$session[$i][3] = 'not reached: an earlier block of the page failed';
			}
			elsif ($said =~ /ERROR|error:/ || ($i == $cur && !$end))
			{
				$session[$i][3] = "$said(exit $ret)";
			}
			else
			{
				$session[$i][3] = '';
			}
		}
	}

	for my $b (@blocks)
	{
		my ($line, $sql, $skip, $failure) = @$b;
	  SKIP:
		{
			skip("$file:$line, $skip", 1) if defined $skip;
			ok($failure eq '', "$file:$line runs") or diag("$sql\n$failure");
			$ran++;
		}
	}
}
cmp_ok($ran, '>=', 15, 'the documentation has SQL blocks that ran');

# what the worked examples did, as they say
sub query
{
	my ($file, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db_of{$file}, $sql);
	return $ret == 0 ? $out : "($err)";
}
is(query('README.md', q{
	SELECT count(*), max(item) FILTER (WHERE id > 1) FROM orders}), '2|lamp',
	"README's example wrote its order beside the demo's");
is(query('README.md', q{
	SELECT state, status, convert_from(body, 'UTF8')::jsonb ->> 'item' FROM idem_record
	 WHERE key = 'key-124'}), 'succeeded|201|lamp',
	"README's example stored its response");
is(query('doc/patterns.md', q{
	SELECT string_agg(message, ',' ORDER BY message), sum(amount) FROM invoices}),
	'm1,m2,m3,m4|160', "patterns.md's consumers wrote one invoice per message");
is(query('doc/outbox.md', q{
	SELECT state, attempt FROM idem_outbox WHERE key = 'order-7/confirmation'}),
	'delivered|1', "outbox.md's message was delivered once");
is(query('doc/incidents.md', q{
	SELECT count(*), sum(amount) FROM refunds}),
	'1|4200', "incidents.md's compensation, run twice, refunded the duplicate once");
is(query('doc/incidents.md', q{
	SELECT key, state, status FROM idem_record WHERE endpoint = 'compensate:POST /v1/charges'}),
	'k-91c2|succeeded|201', "incidents.md's compensation was claimed under the duplicate's key");
is(query('doc/incidents.md', q{
	SELECT (SELECT count(*) FROM idem_record WHERE key = 'k-5e11'),
	       (SELECT count(*) FROM idem_outbox WHERE topic = 'refunds'),
	       (SELECT count(*) FROM idem_freeze) + (SELECT count(*) FROM idem_pause)}),
	'0|1|0', "incidents.md's frozen claim wrote nothing, one refund was enqueued, the stops were lifted");

done_testing();
