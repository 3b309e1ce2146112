--
-- budget.sql: retry budgets (0.4.0).  idem_budget creates a task's budget
-- once (the same total answers it again, another is refused), idem_spend
-- spends it in the caller's transaction and refuses, with IB001 and
-- spending nothing, what it cannot cover; a rolled-back spend is not
-- spent; the binding holds; expired budgets are purged.
--
CREATE EXTENSION idem;
\set VERBOSITY default
SELECT idem_budget('acme', 'task-1', 3);
SELECT idem_budget('acme', 'task-1', 3);
SELECT idem_budget('acme', 'task-1', 5);
SELECT idem_spend('acme', 'task-1');
SELECT idem_spend('acme', 'task-1', 2);
SELECT idem_spend('acme', 'task-1');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT idem_budget('acme', 'task-1', 3);
SELECT tenant, task, total, spent, expires_at - created_at AS ttl FROM idem_budget;

-- a rolled-back spend is not spent; one that cannot be covered spends nothing
SELECT idem_budget('acme', 'task-2', 2, ttl => '1 hour');
BEGIN;
SELECT idem_spend('acme', 'task-2', 2);
ROLLBACK;
SELECT idem_spend('acme', 'task-2', 3);
SELECT idem_spend('acme', 'task-2');
SELECT spent FROM idem_budget WHERE task = 'task-2';

-- no budget, or an expired one
SELECT idem_spend('acme', 'nothing');
UPDATE idem_budget SET expires_at = created_at WHERE task = 'task-2';
SELECT idem_spend('acme', 'task-2');
-- an expired budget is created anew
SELECT idem_budget('acme', 'task-2', 4);
SELECT idem_purge() >= 0 AS purged;
SELECT task FROM idem_budget ORDER BY task;
UPDATE idem_budget SET expires_at = created_at - interval '1 s' WHERE task = 'task-1';
SELECT idem_purge() >= 1 AS purged;
SELECT task FROM idem_budget ORDER BY task;

-- bad input
SELECT idem_budget(NULL, 't', 1);
SELECT idem_budget('acme', '', 1);
SELECT idem_budget('acme', 't', 0);
SELECT idem_budget('acme', 't', NULL);
SELECT idem_budget('acme', 't', 1, ttl => '0 s');
SELECT idem_budget('acme', 't', 1, ttl => NULL);
SELECT idem_spend('acme', 'task-2', 0);
SELECT idem_spend('acme', 'task-2', NULL);

-- the binding: a bound role spends its own tenant's budgets only, as the
-- caller, also inside a security definer function of another role
CREATE ROLE budget_acme LOGIN;
SELECT idem_bind('budget_acme', 'acme');
SELECT idem_budget('globex', 'g', 2);
GRANT SELECT ON idem_budget TO budget_acme;
SET ROLE budget_acme;
SELECT idem_budget('acme', 'a', 2);
SELECT idem_spend('acme', 'a');
SELECT idem_spend('globex', 'g');
SELECT idem_budget('globex', 'g', 2);
SELECT tenant, task, total, spent FROM idem_budget ORDER BY task;
RESET ROLE;
REVOKE SELECT ON idem_budget FROM budget_acme;
CREATE FUNCTION public.spend_as_acme(t text) RETURNS integer
	LANGUAGE sql SECURITY DEFINER AS $$ SELECT public.idem_spend(t, 'g') $$;
ALTER FUNCTION public.spend_as_acme(text) OWNER TO budget_acme;
SELECT public.spend_as_acme('globex');
DROP FUNCTION public.spend_as_acme(text);
SELECT spent FROM idem_budget WHERE task = 'g';
SELECT idem_unbind('budget_acme');
DROP ROLE budget_acme;

DROP EXTENSION idem;
