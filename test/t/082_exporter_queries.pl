# test/t/082_exporter_queries.pl: the monitoring files of doc/monitoring/
# work as doc/incidents.md says.
#
# doc/monitoring/idem-queries.yaml is a custom-queries file of
# postgres_exporter: each top-level key a metric namespace with a query and
# its metrics, one per result column (LABEL, COUNTER or GAUGE).  Here every
# query runs against a server with idem preloaded, as the role that
# doc/incidents.md's grant block makes (that block, taken from the page,
# is what grants it), after staging one of each thing the queries report
# (a duplicate, two freezes, a pause, a dead message); each must succeed,
# return rows, and return exactly the columns its metrics name, with a
# number in every metric column.  The columns of idem_stats and
# idem_outbox_stats that count must all be exported, so a counter added to
# either view is not forgotten here.
#
# doc/monitoring/idem-alerts.yaml is Prometheus alert rules: it must be
# well-formed, every rule must have an alert, an expression and a summary,
# every metric an expression names must be one the queries file makes, and
# every label an annotation names must be a label of those metrics.
#
# Both files are read with CPAN::Meta::YAML, which comes with Perl (no
# other YAML module need be installed); where python3 has PyYAML (Debian's
# python3-yaml), a full YAML parser must read both files to the same data.
use strict;
use warnings;
use File::Basename qw(dirname);
use CPAN::Meta::YAML;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = dirname(__FILE__) . '/../..';
my $queries_file = "$top/doc/monitoring/idem-queries.yaml";
my $alerts_file = "$top/doc/monitoring/idem-alerts.yaml";

sub read_yaml
{
	my ($file) = @_;
	my $y = CPAN::Meta::YAML->read($file)
	  or BAIL_OUT("$file is not YAML that CPAN::Meta::YAML reads: " . CPAN::Meta::YAML->errstr);
	return $y->[0];
}

my $queries = read_yaml($queries_file);
my $alerts = read_yaml($alerts_file);

# the same data through a full YAML parser, where there is one; the text
# of block scalars is compared without its white space (CPAN::Meta::YAML
# drops a block's inner indentation)
SKIP:
{
	my $have = system('python3', '-c', 'import yaml') == 0;
	skip('python3 has no yaml module (python3-yaml)', 2) unless $have;
	my $json = JSON::PP->new->canonical;
	my $squash;
	$squash = sub {
		my ($v) = @_;
		return { map { $_ => $squash->($v->{$_}) } keys %$v } if ref $v eq 'HASH';
		return [ map { $squash->($_) } @$v ] if ref $v eq 'ARRAY';
		return $v if ref $v;
		return defined $v ? ($v =~ s/\s+//gr) : $v;
	};
	for my $pair ([ $queries_file, $queries ], [ $alerts_file, $alerts ])
	{
		my ($file, $data) = @$pair;
		my $out = `python3 -c 'import json, sys, yaml
def s(v):
	if isinstance(v, dict): return {k: s(x) for k, x in v.items()}
	if isinstance(v, list): return [s(x) for x in v]
	if isinstance(v, bool): return "true" if v else "false"
	return str(v)
print(json.dumps(s(yaml.safe_load(open(sys.argv[1])))))' '$file'`;
		is($? == 0 ? $json->encode($squash->(decode_json($out))) : "(python3 failed: $?)",
			$json->encode($squash->($data)),
			"PyYAML reads " . ($file =~ s{.*/}{}r) . " as CPAN::Meta::YAML does");
	}
}

# the queries file's shape: what postgres_exporter reads
my (%columns, %metric_labels, %produced);
my %usage_ok = map { $_ => 1 } qw(LABEL COUNTER GAUGE);
my %key_ok = map { $_ => 1 } qw(query master cache_seconds metrics);
ok(ref $queries eq 'HASH' && %$queries, 'the queries file is a mapping of namespaces');
for my $ns (sort keys %$queries)
{
	my $q = $queries->{$ns};
	my @bad = grep { !$key_ok{$_} } keys %$q;
	ok($ns =~ /^[a-z_][a-z0-9_]*$/ && !@bad && defined $q->{query} && !ref $q->{query}
		  && ref $q->{metrics} eq 'ARRAY' && @{ $q->{metrics} }
		  && ($q->{master} // 'true') eq 'true'
		  && ($q->{cache_seconds} // 0) =~ /^\d+$/,
		"$ns: a namespace with a query and metrics") or diag("keys: @{[ sort keys %$q ]}");
	my (@cols, @labels, @values);
	for my $m (@{ $q->{metrics} })
	{
		my ($col, @more) = keys %$m;
		my $spec = $m->{$col};
		ok(!@more && $col =~ /^[a-z_][a-z0-9_]*$/ && ref $spec eq 'HASH'
			  && $usage_ok{ $spec->{usage} // '' } && ($spec->{description} // '') ne '',
			"$ns.$col: a usage (LABEL, COUNTER or GAUGE) and a description");
		push @cols, $col;
		if (($spec->{usage} // '') eq 'LABEL')
		{
			push @labels, $col;
		}
		else
		{
			push @values, $col;
			$produced{"${ns}_$col"} = $ns;
		}
	}
	$columns{$ns} = [ \@cols, \@labels, \@values ];
	$metric_labels{$ns} = { map { $_ => 1 } @labels };
}

# a server as doc/incidents.md's exporter reads it: idem preloaded
my $node = PostgreSQL::Test::Cluster->new('exporter');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE idem');
$node->safe_psql('idem', 'CREATE EXTENSION idem');

# the exporter's role, by doc/incidents.md's own block
my ($grants) = grep { /CREATE ROLE idem_exporter/ }
  (slurp_file("$top/doc/incidents.md") =~ /^```sql\n(.*?)^```/msg);
ok(defined $grants, "doc/incidents.md has the exporter's grant block");
$node->safe_psql('idem', $grants // 'SELECT');

# one of each thing the queries report: a duplicate (one request under two
# keys), two freezes (one endpoint until a time, a whole tenant), a pause,
# and messages, one of them dead
$node->safe_psql('idem', q{
	SELECT idem_claim('acme', 'POST /v1/charges', 'k-1', '{"amount": 4200}'::jsonb);
	SELECT idem_claim('acme', 'POST /v1/charges', 'k-2', '{"amount": 4200}'::jsonb);
	SELECT idem_complete('acme', 'POST /v1/charges', 'k-1', 201, 'one');
	SELECT idem_complete('acme', 'POST /v1/charges', 'k-2', 201, 'two');
	SELECT idem_freeze('acme', 'POST /v1/charges', 'INC-7', now() + interval '1 hour');
	SELECT idem_freeze('globex', NULL, 'INC-8');
	SELECT idem_pause('receipts', 'acme');
	SELECT idem_enqueue('acme', 'refunds', 'refund/k-2', 'r');
	SELECT idem_enqueue('acme', 'refunds', 'refund/k-3', 'r');
	SELECT idem_enqueue('acme', 'receipts', 'receipt/k-1', 'r');
});
$node->safe_psql('idem', q{
	SELECT idem_dead(id, attempt, 'refused') FROM idem_take('refunds', 1)});
my $frozen_claims = $node->safe_psql('idem', q{
	SELECT outcome FROM idem_claim('acme', 'POST /v1/charges', 'k-4')});
is($frozen_claims, 'frozen', 'the staged freeze holds');

# each query, as the exporter's role: the columns its metrics name, rows,
# numbers in the metric columns
my $number = qr/^-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$/;
my %rows;
for my $ns (sort keys %$queries)
{
	my ($cols, $labels, $values) = @{ $columns{$ns} };
	my $sql = $queries->{$ns}{query} =~ s/;?\s*\z//r;
	my ($ret, $out, $err) = $node->psql('idem', "COPY ($sql) TO STDOUT WITH (FORMAT csv, HEADER)",
		extra_params => [ '-U', 'idem_exporter' ]);
	ok($ret == 0 && $err eq '', "$ns: its query runs as idem_exporter") or diag($err);
	my ($head, @lines) = split /\n/, $out // '';
	is($head // '', join(',', @$cols), "$ns: its columns are its metrics");
	cmp_ok(scalar @lines, '>=', 1, "$ns: it returns rows");
	my @bad;
	for my $line (@lines)
	{
		# the values staged here have no comma or quote
		my %v;
		@v{ split /,/, $head } = split /,/, $line, -1;
		push @{ $rows{$ns} }, \%v;
		push @bad, map { "$_=" . ($v{$_} // '(none)') }
		  grep { ($v{$_} // '') !~ $number && !($_ =~ /^last_purge/ && ($v{$_} // '') eq '') }
		  @$values;
	}
	ok(!@bad, "$ns: every metric column is a number") or diag("@bad");
}

# what the staged incident shows
my ($suspect) = grep { $_->{endpoint} eq 'POST /v1/charges' } @{ $rows{idem_suspects} // [] };
is($suspect ? "$suspect->{tenant} $suspect->{groups} $suspect->{keys}" : '(none)',
	'acme 1 2', 'idem_suspects: the duplicate, one group of two keys');
is(join(' ', map { "$_->{tenant}:$_->{endpoint}:$_->{has_until}" }
		sort { $a->{tenant} cmp $b->{tenant} } @{ $rows{idem_frozen} // [] }),
	'acme:POST /v1/charges:1 globex:*:0', 'idem_frozen: both freezes, * for a whole tenant');
is(join(' ', map { "$_->{topic}:$_->{tenant}" } @{ $rows{idem_paused} // [] }),
	'receipts:acme', 'idem_paused: the pause');
my ($refunds) = grep { $_->{topic} eq 'refunds' } @{ $rows{idem_outbox} // [] };
is($refunds ? "$refunds->{queued} $refunds->{dead}" : '(none)', '1 1',
	'idem_outbox: the queued and the dead message');
my ($stats) = grep { $_->{datname} eq 'idem' } @{ $rows{idem_stats} // [] };
is($stats ? "$stats->{claims_claimed} $stats->{claims_frozen}" : '(none)', '2 1',
	'idem_stats: the claims, the frozen one included');

# every counting column of the two views is exported
for my $pair ([ 'idem_stats', 'idem_stats' ], [ 'idem_outbox_stats', 'idem_outbox' ])
{
	my ($view, $ns) = @$pair;
	my @counts = split /\n/, $node->safe_psql('idem', qq{
		SELECT attname FROM pg_attribute
		 WHERE attrelid = '$view'::regclass AND attnum > 0 AND NOT attisdropped
		   AND atttypid = 'bigint'::regtype ORDER BY attnum});
	my @missing = grep { !$produced{"${ns}_$_"} } @counts;
	ok(@counts && !@missing, "$ns exports every count of $view")
	  or diag("missing: @missing");
}

# the alert rules
my @rules;
ok(ref $alerts eq 'HASH' && ref $alerts->{groups} eq 'ARRAY' && @{ $alerts->{groups} },
	'the alerts file has groups');
for my $g (@{ $alerts->{groups} // [] })
{
	ok(($g->{name} // '') ne '' && ref $g->{rules} eq 'ARRAY' && @{ $g->{rules} },
		'group ' . ($g->{name} // '?') . ': a name and rules');
	push @rules, @{ $g->{rules} // [] };
}
my %seen;
for my $r (@rules)
{
	my $name = $r->{alert} // '?';
	ok(($r->{alert} // '') =~ /^[A-Za-z_][A-Za-z0-9_]*$/ && !$seen{$name}++
		  && ($r->{expr} // '') ne '' && ref $r->{annotations} eq 'HASH'
		  && ($r->{annotations}{summary} // '') ne ''
		  && (!defined $r->{for} || $r->{for} =~ /^\d+[smhd]$/),
		"$name: an alert, an expression and a summary");
	my @names = ($r->{expr} // '') =~ /\b(idem_[a-z0-9_]+)\b/g;
	my @unknown = grep { !$produced{$_} } @names;
	ok(@names && !@unknown, "$name: its expression uses metrics of the queries file")
	  or diag('not made by idem-queries.yaml: ' . join(' ', @unknown, @names ? () : '(none)'));
	my %labels = map { %{ $metric_labels{ $produced{$_} // '' } // {} } } @names;
	my @used = map { /\$labels\.([a-z_]+)/g } values %{ $r->{annotations} // {} };
	my @nolabel = grep { !$labels{$_} } @used;
	ok(!@nolabel, "$name: its annotations name labels its metrics have")
	  or diag("not a label: @nolabel");
}
cmp_ok(scalar @rules, '>=', 5, 'the alerts file has its rules');

done_testing();
