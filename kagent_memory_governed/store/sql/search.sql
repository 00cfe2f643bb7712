-- The live entries of a scope, sealed, for the process to open and rank (store/sealing.py): fence and entries in
-- one snapshot, and one ledger row counting the entries read. A row an entry, in no particular order, each with
-- the refusal NULL; refused, or nothing live, one row of the refusal (or NULL) and NULLs. Rows, not arrays: as
-- four arrays, a scope's 300 KB of ciphertext cost the server about a millisecond more to build and send. No query
-- vector reaches the database.
CREATE OR REPLACE FUNCTION governed_memory.search(p_scope uuid, p_generation bigint, p_now timestamptz)
RETURNS TABLE (refusal text, entry_id uuid, sealed bytea, created_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- a read's ledger row: losing the last few on a crash is acceptable
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH verdict AS (
        SELECT governed_memory.fence(s, p_generation, p_now) AS refusal
        FROM (VALUES (1)) AS one LEFT JOIN governed_memory.scopes AS s ON s.scope_id = p_scope
    ), scoped AS MATERIALIZED (
        -- the scope's rows by the primary key alone, then the live ones: a cached generic plan must never
        -- join the expiry index in (a bitmap over every live entry of every scope)
        SELECT e.entry_id, e.sealed, e.created_at, e.expires_at
        FROM verdict, governed_memory.entries AS e
        WHERE verdict.refusal IS NULL AND e.scope_id = p_scope
    ), live AS MATERIALIZED (
        SELECT * FROM scoped WHERE scoped.expires_at > p_now
    ), recorded AS (
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation, count)
        SELECT p_now, 'search', CASE WHEN v.refusal IS NULL THEN 'ok' ELSE 'refused' END, v.refusal, p_scope,
            p_generation, CASE WHEN v.refusal IS NULL THEN (SELECT count(*) FROM live) END
        FROM verdict AS v
    )
    SELECT v.refusal, l.entry_id, l.sealed, l.created_at, l.expires_at FROM verdict AS v LEFT JOIN live AS l ON true;
END
$$;
