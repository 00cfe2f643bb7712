CREATE OR REPLACE FUNCTION governed_memory.write(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_facts text[], p_vectors vector[], p_cap integer,
    p_lifetime_seconds bigint
) RETURNS TABLE (refusal text, fact text, entry_id uuid) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    v_refusal text;
    v_live bigint;
    v_new bigint;
    v_added bigint;
BEGIN
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope FOR UPDATE;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NULL THEN
        -- statements of their own, after the lock: they see what earlier lock holders committed
        SELECT count(*) INTO v_live FROM governed_memory.entries WHERE scope_id = p_scope AND expires_at > p_now;
        SELECT count(DISTINCT u.f) INTO v_new FROM unnest(p_facts) AS u(f)
        WHERE NOT EXISTS (
            SELECT FROM governed_memory.entries AS e
            WHERE e.scope_id = p_scope AND e.expires_at > p_now AND e.text = u.f
        );
        IF v_new > 0 AND v_live + v_new > least(s.entry_cap, p_cap) THEN
            v_refusal := 'entry_cap_reached';
        END IF;
    END IF;
    IF v_refusal IS NOT NULL THEN
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation)
        VALUES (p_now, 'write', 'refused', v_refusal, p_scope, p_generation);
        RETURN QUERY SELECT v_refusal, NULL::text, NULL::uuid;
        RETURN;
    END IF;
    INSERT INTO governed_memory.entries (scope_id, entry_id, text, embedding, generation, created_at, expires_at)
    SELECT DISTINCT ON (u.f) p_scope, gen_random_uuid(), u.f, u.v, p_generation, p_now,
        p_now + make_interval(secs => least(p_lifetime_seconds, s.max_expiry_seconds))
    FROM unnest(p_facts, p_vectors) WITH ORDINALITY AS u(f, v, i)
    WHERE NOT EXISTS (
        SELECT FROM governed_memory.entries AS e WHERE e.scope_id = p_scope AND e.expires_at > p_now AND e.text = u.f
    )
    ORDER BY u.f, u.i;
    GET DIAGNOSTICS v_added = ROW_COUNT;
    INSERT INTO governed_memory.ledger (at, operation, result, scope_id, generation, count)
    VALUES (p_now, 'write', 'ok', p_scope, p_generation, v_added);
    RETURN QUERY SELECT NULL::text, e.text, e.entry_id FROM governed_memory.entries AS e
    WHERE e.scope_id = p_scope AND e.expires_at > p_now AND e.text = ANY (p_facts);
END
$$
