-- The top-k live entries for each query vector, fence and entries in one snapshot, and one ledger row.
CREATE OR REPLACE FUNCTION governed_memory.search(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_queries @extschema:vector@.vector[],
    p_top_k integer, p_max_distance double precision
) RETURNS TABLE (
    refusal text, query integer, entry_id uuid, fact text, created_at timestamptz, expires_at timestamptz,
    distance double precision
) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- a read's ledger row: losing the last few on a crash is acceptable
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH verdict AS (
        SELECT governed_memory.fence(s, p_generation, p_now) AS refusal
        FROM (VALUES (1)) AS one LEFT JOIN governed_memory.scopes AS s ON s.scope_id = p_scope
    ), queries AS MATERIALIZED (
        SELECT q.n::integer AS n, q.v FROM unnest(p_queries) WITH ORDINALITY AS q(v, n)
    ), scored AS MATERIALIZED (  -- the scope's live entries read once, each distance computed once
        SELECT q.n, e.entry_id, e.text, e.created_at, e.expires_at,
            e.embedding OPERATOR(@extschema:vector@.<=>) q.v AS distance
        FROM verdict, queries AS q, governed_memory.entries AS e
        WHERE verdict.refusal IS NULL AND e.scope_id = p_scope AND e.expires_at > p_now
    ), hits AS (
        SELECT * FROM (
            SELECT c.*, row_number() OVER (PARTITION BY c.n ORDER BY c.distance, c.entry_id) AS rank
            FROM scored AS c WHERE c.distance <= p_max_distance
        ) AS ranked WHERE ranked.rank <= p_top_k
    ), recorded AS (
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation, count)
        SELECT p_now, 'search', CASE WHEN v.refusal IS NULL THEN 'ok' ELSE 'refused' END, v.refusal, p_scope,
            p_generation, CASE WHEN v.refusal IS NULL THEN (SELECT count(*) FROM hits) END
        FROM verdict AS v
    )
    SELECT v.refusal, h.n, h.entry_id, h.text, h.created_at, h.expires_at, h.distance
    FROM verdict AS v LEFT JOIN hits AS h ON true
    ORDER BY h.n, h.distance, h.entry_id;
END
$$;
