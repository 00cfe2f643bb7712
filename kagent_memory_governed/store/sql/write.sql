-- Store facts under the scope lock: fence; read the scope's live entries once, after the lock; keep a fact equal
-- to a live entry as that entry (R36); refuse past the cap (never evict); insert the rest; one ledger row.
CREATE OR REPLACE FUNCTION governed_memory.write(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_facts text[], p_vectors @extschema:vector@.vector[],
    p_cap integer, p_lifetime_seconds bigint
) RETURNS TABLE (refusal text, fact text, entry_id uuid) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    v_refusal text;
    v_live_texts text[];
    v_live_ids uuid[];
    v_new bigint;
BEGIN
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope FOR UPDATE;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NULL THEN
        -- a statement of its own, after the lock: it sees what earlier lock holders committed
        SELECT coalesce(array_agg(e.text), '{}'), coalesce(array_agg(e.entry_id), '{}')
        INTO v_live_texts, v_live_ids
        FROM governed_memory.entries AS e WHERE e.scope_id = p_scope AND e.expires_at > p_now;
        SELECT count(DISTINCT u.f) INTO v_new FROM unnest(p_facts) AS u(f) WHERE u.f <> ALL (v_live_texts);
        IF v_new > 0 AND cardinality(v_live_texts) + v_new > least(s.entry_cap, p_cap) THEN
            v_refusal := 'entry_cap_reached';
        END IF;
    END IF;
    IF v_refusal IS NOT NULL THEN
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation)
        VALUES (p_now, 'write', 'refused', v_refusal, p_scope, p_generation);
        RETURN QUERY SELECT v_refusal, NULL::text, NULL::uuid;
        RETURN;
    END IF;
    INSERT INTO governed_memory.ledger (at, operation, result, scope_id, generation, count)
    VALUES (p_now, 'write', 'ok', p_scope, p_generation, v_new);
    RETURN QUERY WITH added AS (
        INSERT INTO governed_memory.entries AS n
            (scope_id, entry_id, text, embedding, generation, created_at, expires_at)
        SELECT DISTINCT ON (u.f) p_scope, gen_random_uuid(), u.f, u.v, p_generation, p_now,
            p_now + make_interval(secs => least(p_lifetime_seconds, s.max_expiry_seconds))
        FROM unnest(p_facts, p_vectors) WITH ORDINALITY AS u(f, v, i)
        WHERE u.f <> ALL (v_live_texts)
        ORDER BY u.f, u.i
        RETURNING n.text, n.entry_id
    )
    SELECT NULL::text, a.text, a.entry_id FROM added AS a
    UNION ALL
    SELECT NULL::text, l.f, l.id FROM unnest(v_live_texts, v_live_ids) AS l(f, id) WHERE l.f = ANY (p_facts);
END
$$;
