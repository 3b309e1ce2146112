-- test/memory.sql: one backend claims and completes :calls keys, committing
-- every thousand, and its memory must stay flat (make memcheck).
CREATE EXTENSION idem;
CREATE PROCEDURE hammer(n int, prefix text) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		PERFORM idem_claim('memory', 'POST /x', prefix || i, 'request');
		PERFORM idem_complete('memory', 'POST /x', prefix || i, 201, 'response');
		IF i % 1000 = 0 THEN
			COMMIT;
		END IF;
	END LOOP;
END
$$;
CREATE FUNCTION memory_used(OUT total bigint, OUT top bigint, OUT cache bigint)
LANGUAGE sql AS $$
	SELECT sum(total_bytes),
		   sum(total_bytes) FILTER (WHERE name = 'TopMemoryContext'),
		   sum(total_bytes) FILTER (WHERE name = 'CacheMemoryContext')
	  FROM pg_backend_memory_contexts
$$;

-- warm up: plans prepared, caches filled
CALL hammer(20000, 'warm-');
SELECT total AS before_total, top AS before_top, cache AS before_cache FROM memory_used() \gset
\timing on
CALL hammer(:calls, 'run-');
\timing off
SELECT total AS after_total, top AS after_top, cache AS after_cache FROM memory_used() \gset

SELECT :calls AS calls,
	   :before_total AS total_before, :after_total AS total_after,
	   :before_top AS top_before, :after_top AS top_after,
	   :before_cache AS cache_before, :after_cache AS cache_after;

-- flat: the backend's memory grew by less than 64 kB over all the calls
CREATE FUNCTION assert_flat(before bigint, after bigint) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	IF after - before >= 65536 THEN
		RAISE EXCEPTION 'backend memory grew by % bytes', after - before;
	END IF;
	RETURN format('backend memory flat: %s bytes before, %s after', before, after);
END
$$;
SELECT assert_flat(:before_total, :after_total);
