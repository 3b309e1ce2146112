# test/t/071_lost_reply.pl: a reply lost at the wire, the case idem exists
# for.  A TCP proxy between a retrying client and the server reads the
# protocol both ways and, for a fifth of the connections, cuts them at
# COMMIT: half of those after the server answered it (the transaction
# committed; the client never learns), half before the COMMIT reached the
# server (it rolled back).  400 business operations, each retried with its
# key on a new connection until it gets an answer: exactly 400 business
# rows, one per key; an operation whose committed reply was lost is answered
# "replay" by its retry, one whose COMMIT was lost "claimed".
use strict;
use warnings;
use IO::Select;
use IPC::Run;
use IO::Socket::INET;
use IO::Socket::UNIX;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $operations = 400;

my $node = PostgreSQL::Test::Cluster->new('lost_reply');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
max_connections = 40
});
$node->start;

# The business operation: claim, write the business row, store the
# response, all in the caller's transaction; the caller commits
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE TABLE payments (key text NOT NULL, amount integer NOT NULL);
	CREATE FUNCTION pay(k text) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE
		c record;
	BEGIN
		SELECT * INTO c FROM idem_claim('shop', 'POST /payments', k, 'amount=100');
		IF c.outcome = 'claimed' THEN
			INSERT INTO payments VALUES (k, 100);
			PERFORM idem_complete('shop', 'POST /payments', k, 201, 'paid ' || k);
		END IF;
		RETURN c.outcome;
	END $$;
});

# ---- the proxy: one process, accepting on 127.0.0.1, a child per
# connection that pumps both ways and reads the messages it passes on.
# Its processes (and the clients' below) leave with POSIX::_exit, also on
# SIGTERM, so that the test's END blocks (which stop the node) run in the
# test's own process only.
# Connection n (from 1) is cut after the server's reply to COMMIT when
# n % 10 == 3, and before the client's COMMIT reaches the server when
# n % 10 == 7; each cut is logged with the operation's key.
my $log = $node->basedir . '/proxy.log';
my $listener = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => 0,
	Listen => 64,
	ReuseAddr => 1) or die "proxy: $!";
my $proxy_port = $listener->sockport;
my $server_socket = $node->host . '/.s.PGSQL.' . $node->port;

# messages MSG..., parsed from the front of BUF: [type, payload] pairs;
# what is left is an incomplete message.  The client's first message (the
# startup packet) has no type byte.
sub messages
{
	my ($buf, $untyped) = @_;
	my @m;
	while (1)
	{
		if ($$untyped)
		{
			last if length($$buf) < 4;
			my $len = unpack('N', substr($$buf, 0, 4));
			last if length($$buf) < $len;
			push @m, [ '', substr($$buf, 4, $len - 4), substr($$buf, 0, $len) ];
			substr($$buf, 0, $len) = '';
			$$untyped = 0;
			next;
		}
		last if length($$buf) < 5;
		my $len = unpack('N', substr($$buf, 1, 4));
		last if length($$buf) < 1 + $len;
		push @m, [ substr($$buf, 0, 1), substr($$buf, 5, $len - 4),
			substr($$buf, 0, 1 + $len) ];
		substr($$buf, 0, 1 + $len) = '';
	}
	return @m;
}

sub cut
{
	my ($how, $key) = @_;
	open(my $fh, '>>', $log) or die;
	syswrite($fh, "$how $key\n");
	close($fh);
	POSIX::_exit(0);
}

sub pump
{
	my ($client, $n) = @_;
	my $server = IO::Socket::UNIX->new(Peer => $server_socket)
	  or die "proxy: server: $!";
	my $mode = $n % 10 == 3 ? 'reply' : $n % 10 == 7 ? 'request' : '';
	my ($from_client, $from_server, $key) = ('', '', '?');
	my ($client_untyped, $server_untyped) = (1, 0);
	my $sel = IO::Select->new($client, $server);
	while (my @ready = $sel->can_read(60))
	{
		for my $fh (@ready)
		{
			my $data;
			my $got = sysread($fh, $data, 65536);
			return unless $got;
			if ($fh == $client)
			{
				$from_client .= $data;
				for my $m (messages(\$from_client, \$client_untyped))
				{
					my ($type, $payload, $raw) = @$m;
					$key = $1 if $type eq 'Q' && $payload =~ /pay\('([^']*)'\)/;
					cut('request', $key)
					  if $mode eq 'request' && $type eq 'Q' && $payload =~ /^COMMIT/;
					syswrite($server, $raw);
				}
			}
			else
			{
				$from_server .= $data;
				for my $m (messages(\$from_server, \$server_untyped))
				{
					my ($type, $payload, $raw) = @$m;
					cut('reply', $key)
					  if $mode eq 'reply' && $type eq 'C' && $payload =~ /^COMMIT/;
					syswrite($client, $raw);
				}
			}
		}
	}
}

my $proxy = fork();
die "fork: $!" unless defined $proxy;
if ($proxy == 0)
{
	# PostgreSQL::Test::Utils (16+) makes SIGTERM a die, whose END blocks
	# would stop the node from this process
	$SIG{TERM} = sub { POSIX::_exit(0) };
	$SIG{CHLD} = 'IGNORE';
	my $n = 0;
	while (my $client = $listener->accept)
	{
		$n++;
		my $child = fork();
		if (defined $child && $child == 0)
		{
			eval { pump($client, $n) };
			print STDERR "proxy: $@" if $@;
			POSIX::_exit(0);
		}
		close($client);
	}
	POSIX::_exit(0);
}
close($listener);

# ---- the clients: four at once, each operation's key made once, before
# its retry loop; each attempt a new connection through the proxy, retried
# until an answer comes back.  Each client writes the answer every
# operation finally got to a file of its own.
my $connstr = "host=127.0.0.1 port=$proxy_port dbname=postgres sslmode=disable gssencmode=disable";
my $clients = 4;
my @pids;
for my $c (0 .. $clients - 1)
{
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid)
	{
		push @pids, $pid;
		next;
	}
	$SIG{TERM} = sub { POSIX::_exit(1) };
	open(my $out, '>', $node->basedir . "/client$c.out") or POSIX::_exit(1);
	for (my $i = 1 + $c; $i <= $operations; $i += $clients)
	{
		my $key = "pay-$i";
		my ($answer, $tries) = ('none', 0);
		while ($tries++ < 20)
		{
			my ($stdout, $stderr);
			IPC::Run::run(
				[ 'psql', '-X', '-A', '-t', '-q', '-d', $connstr,
				  '-c', 'BEGIN', '-c', "SELECT pay('$key')", '-c', 'COMMIT' ],
				'>', \$stdout, '2>', \$stderr);
			next unless $stderr eq '' && $stdout =~ /^(\w+)$/m;
			# in_progress: the server has not yet seen that the
			# connection of a cut COMMIT is gone, and its claim still
			# stands; retry, as an HTTP client retries a 409
			if ($1 eq 'in_progress')
			{
				select(undef, undef, undef, 0.05);
				next;
			}
			$answer = $1;
			last;
		}
		print $out "$key $answer $tries\n";
	}
	close($out);
	POSIX::_exit(0);
}
waitpid($_, 0) for @pids;

my (%final, $attempts, $unanswered);
for my $c (0 .. $clients - 1)
{
	open(my $in, '<', $node->basedir . "/client$c.out") or die "client $c: $!";
	while (<$in>)
	{
		my ($key, $answer, $tries) = split;
		$attempts += $tries;
		if ($answer eq 'none') { $unanswered++ }
		else { $final{$key} = $answer }
	}
	close($in);
}
kill 'TERM', $proxy;
waitpid($proxy, 0);

my %cut;
open(my $fh, '<', $log) or die "no proxy log: $!";
while (<$fh>)
{
	my ($how, $key) = split;
	push @{ $cut{$how}{$key} }, 1;
}
close($fh);
my $replies_lost = keys %{ $cut{reply} // {} };
my $requests_lost = keys %{ $cut{request} // {} };
note("$attempts attempts for $operations operations; "
	  . "$replies_lost operations lost a committed reply, $requests_lost a COMMIT");

is($unanswered // 0, 0, 'every operation got an answer within 20 attempts');
is(scalar(keys %final) + ($unanswered // 0), $operations, 'every operation was tried');
cmp_ok($replies_lost, '>=', $operations / 20,
	'the proxy cut connections after a committed COMMIT');
cmp_ok($requests_lost, '>=', $operations / 20,
	'the proxy cut connections before the COMMIT reached the server');
is($node->safe_psql('postgres',
		q{SELECT count(*) || ' ' || count(DISTINCT key) FROM payments}),
	"$operations $operations",
	'exactly one business row per operation');

# the answer an operation finally got: replay when one of its attempts
# committed without the client learning it, else claimed
my @wrong = grep {
	$final{$_} ne ($cut{reply}{$_} ? 'replay' : 'claimed')
} sort keys %final;
is(scalar(@wrong), 0,
	'a retry after a lost committed reply answers replay; after a lost COMMIT, claimed')
  or diag(join(', ', map { "$_: $final{$_}" } @wrong[ 0 .. ($#wrong < 9 ? $#wrong : 9) ]));

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_record WHERE state <> 'succeeded'}), '0',
	'no claim is left pending');

done_testing();
