-- Take, once, the candidate turns of a session admitted under the current generation; the session's turns of
-- any other generation are discarded, so nothing said before an erasure or a withdrawal is collected (R36).
CREATE OR REPLACE FUNCTION governed_memory.collect_turns(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_session uuid, p_candidates uuid[]
) RETURNS TABLE (refusal text, invocation_ref uuid, recalled boolean) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    v_refusal text;
    v_taken bigint;
BEGIN
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NOT NULL THEN
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation)
        VALUES (p_now, 'collect', 'refused', v_refusal, p_scope, p_generation);
        RETURN QUERY SELECT v_refusal, NULL::uuid, NULL::boolean;
        RETURN;
    END IF;
    DELETE FROM governed_memory.turns AS t
    WHERE t.scope_id = p_scope AND t.session_ref = p_session AND t.generation <> p_generation;
    RETURN QUERY WITH taken AS (
        DELETE FROM governed_memory.turns AS t
        WHERE t.scope_id = p_scope AND t.session_ref = p_session AND t.invocation_ref = ANY (p_candidates)
        RETURNING t.invocation_ref, t.recalled
    ) SELECT NULL::text, taken.invocation_ref, taken.recalled FROM taken;
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    INSERT INTO governed_memory.ledger (at, operation, result, scope_id, generation, count)
    VALUES (p_now, 'collect', 'ok', p_scope, p_generation, v_taken);
END
$$;
