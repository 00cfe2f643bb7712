-- A turn admitted under the current consent, recorded once; how many of its session's turns under that
-- generation now await auto-save. A fenced-off turn is not recorded (R36).
CREATE OR REPLACE FUNCTION governed_memory.record_turn(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_session uuid, p_invocation uuid, p_recalled boolean
) RETURNS TABLE (refusal text, waiting bigint) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    v_refusal text;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, 0::bigint;
        RETURN;
    END IF;
    INSERT INTO governed_memory.turns AS t (scope_id, session_ref, invocation_ref, generation, recalled, at)
    VALUES (p_scope, p_session, p_invocation, p_generation, p_recalled, p_now)
    ON CONFLICT (scope_id, session_ref, invocation_ref) DO UPDATE SET recalled = t.recalled OR excluded.recalled;
    RETURN QUERY SELECT NULL::text, count(*) FROM governed_memory.turns AS t
    WHERE t.scope_id = p_scope AND t.session_ref = p_session AND t.generation = p_generation;
END
$$;
