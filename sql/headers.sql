--
-- headers.sql: response headers, stored with the response and replayed
--
CREATE EXTENSION idem;
\pset null '(null)'

-- a 201 with its Location and Content-Type: the replay gives back the
-- stored jsonb value, the same value whatever the key order it came in
SELECT outcome, headers FROM idem_claim('acme', 'POST /orders', 'h1');
SELECT idem_complete('acme', 'POST /orders', 'h1', 201, '{"id": 7}'::jsonb,
                     headers => '{"Location": "/orders/7", "Content-Type": "application/json"}');
SELECT outcome, status, headers, convert_from(body, 'UTF8') AS body
  FROM idem_claim('acme', 'POST /orders', 'h1');
SELECT headers = '{"Content-Type": "application/json", "Location": "/orders/7"}'::jsonb
       AS same_value,
       headers::text
  FROM idem_replay('acme', 'POST /orders', 'h1');
SELECT headers FROM idem_record WHERE key = 'h1';

-- values are kept as given: case, white space and every byte of UTF-8
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h2');
SELECT idem_complete('acme', 'POST /orders', 'h2', 200, 'ok',
                     NULL, '{"X-Note": "  café \"quoted\" ", "x-note": "lower"}');
SELECT headers->>'X-Note' AS upper_name, headers->>'x-note' AS lower_name
  FROM idem_replay('acme', 'POST /orders', 'h2');

-- a header sent more than once is an array of strings
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h3');
SELECT idem_complete('acme', 'POST /orders', 'h3', 200, NULL::bytea,
                     headers => '{"Set-Cookie": ["a=1", "b=2"]}');
SELECT headers FROM idem_claim('acme', 'POST /orders', 'h3');

-- no headers: NULL, and an empty object stays an empty object
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h4');
SELECT idem_complete('acme', 'POST /orders', 'h4', 204, NULL::bytea);
SELECT outcome, status, headers FROM idem_claim('acme', 'POST /orders', 'h4');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h5');
SELECT idem_complete('acme', 'POST /orders', 'h5', 204, NULL::text, headers => '{}');
SELECT outcome, headers FROM idem_replay('acme', 'POST /orders', 'h5');

-- a failure stores its headers too: a 429's Retry-After is replayed
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h6');
SELECT idem_fail('acme', 'POST /orders', 'h6', 429, 'slow down'::text,
                 headers => '{"Retry-After": "30"}');
SELECT outcome, status, headers FROM idem_claim('acme', 'POST /orders', 'h6');

-- a retryable failure's headers are not replayed: the next claim executes,
-- and its pending record has none
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h7');
SELECT idem_fail('acme', 'POST /orders', 'h7', 503, 'down'::bytea, true, 1,
                 '{"Retry-After": "5"}');
SELECT outcome, attempt, headers FROM idem_claim('acme', 'POST /orders', 'h7');
SELECT state, headers FROM idem_record WHERE key = 'h7';
SELECT outcome, headers FROM idem_claim('acme', 'POST /orders', 'h7');

-- in_progress and mismatch answers carry no headers
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'h8', 'a');
SELECT outcome, headers FROM idem_claim('acme', 'POST /orders', 'h8', 'a');
SELECT idem_complete('acme', 'POST /orders', 'h8', 200, 'x', headers => '{"A": "b"}');
SELECT outcome, headers FROM idem_claim('acme', 'POST /orders', 'h8', 'b');

-- the operator listing shows headers with the bodies
SELECT key, headers FROM idem_list('acme', with_body => true) WHERE key IN ('h1', 'h6');
SELECT key, headers FROM idem_list('acme') WHERE key = 'h1';

-- bad headers are refused (22023), naming what is wrong, and store nothing
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'bad');
\set VERBOSITY default
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '"text/plain"');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '["a"]');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"Content-Length": 5}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"A": null}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"A": {"b": "c"}}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"A": [["b"]]}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"A": ["b", 1]}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"Bad Name": "x"}');
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '{"": "x"}');
SELECT idem_fail('acme', 'POST /orders', 'bad', 500, 'x', headers => '{"X": "a\r\nSet-Cookie: evil=1"}');
SELECT state, headers FROM idem_record WHERE key = 'bad';
\set VERBOSITY sqlstate
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, 'x', headers => '["a"]');
SELECT idem_fail('acme', 'POST /orders', 'bad', 500, 'x', true, headers => '{"A": 1}');
\set VERBOSITY default

-- idem.max_body_size bounds the body and the headers together
SET idem.max_body_size = '1kB';
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, repeat('x', 1000),
                     headers => jsonb_build_object('X-Pad', repeat('y', 100)));
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, repeat('x', 1025));
SELECT idem_complete('acme', 'POST /orders', 'bad', 200, repeat('x', 900),
                     headers => jsonb_build_object('X-Pad', repeat('y', 50)));
RESET idem.max_body_size;
SELECT state, status, length(body) AS body_bytes, headers->>'X-Pad' = repeat('y', 50) AS pad
  FROM idem_record WHERE key = 'bad';
\set VERBOSITY terse

-- wait_timeout needs wait, and must not be negative (22023)
\set VERBOSITY sqlstate
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'w1', wait_timeout => '1s');
SELECT outcome FROM idem_claim('acme', 'POST /orders', 'w1', wait => true, wait_timeout => '-1s');

DROP EXTENSION idem;
