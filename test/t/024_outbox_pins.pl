# test/t/024_outbox_pins.pl: finishing a message writes its new version from
# a copy of the locked tuple, not from pointers into a page that nothing
# pins any more.  A slow CHECK constraint holds idem_delivered() between
# taking the row's values and writing them; meanwhile a VACUUM compacts the
# page and a rolled-back enqueue of another tenant's messages fills it.  The
# delivered message must still be itself (its tenant, key and payload), not
# bytes of the other tenant's rows.  (Found by a review; before the fix the
# message came out as tenant "b", key "Z005", payload "ZZZ...".)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('pins');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idem'
autovacuum = off
idem.purge_interval = '1h'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE FUNCTION slow_check(s text) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		IF s = 'delivered' AND current_setting('test.slow', true) = 'on' THEN
			PERFORM pg_sleep(3);
		END IF;
		RETURN true;
	END $$;
	ALTER TABLE idem_outbox ADD CONSTRAINT slow CHECK (slow_check(state));
	SELECT count(idem_enqueue('t', 'pin', 'F00' || g, repeat('f', 500))) FROM generate_series(1, 4) g;
	SELECT count(*) FROM idem_take('pin', 10, '1 h');
	SELECT idem_enqueue('t', 'pin', 'MMMM', repeat('M', 500));
	SELECT count(*) FROM idem_take('pin', 10, '1 h');
});
my $id = $node->safe_psql('postgres', q{SELECT id FROM idem_outbox WHERE key = 'MMMM'});

my $finisher = $node->background_psql('postgres');
$finisher->query_safe(q{SET test.slow = 'on'});
$finisher->query_until(qr/started/, qq{\\echo started\nSELECT idem_delivered($id, 1, 200, 'ok');\n});
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE query LIKE 'SELECT idem_delivered%' AND wait_event = 'PgSleep'})
  or die 'the finisher never reached its CHECK constraint';
$node->safe_psql('postgres', q{VACUUM idem_outbox});
$node->safe_psql('postgres', q{BEGIN;
	SELECT count(idem_enqueue('b', 'oth', 'Z00' || g, repeat('Z', 500))) FROM generate_series(1, 5) g;
	ROLLBACK});
$finisher->quit;

is($node->safe_psql('postgres', qq{SELECT tenant, topic, key, payload = convert_to(repeat('M', 500), 'UTF8'), state
	FROM idem_outbox WHERE id = $id}),
	't|pin|MMMM|t|delivered', 'the delivered message is still itself');
is($node->safe_psql('postgres', q{SELECT state, attempt, status FROM idem_message('t', 'pin', 'MMMM')}),
	'delivered|1|200', 'and idem_message finds it under its own key');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_outbox WHERE tenant = 'b'}),
	'0', 'no row of the rolled-back enqueue is visible');

done_testing();
