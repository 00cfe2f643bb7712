CREATE OR REPLACE PROCEDURE governed_memory.clear(
    p_scope uuid, p_generation bigint, p_operation text, p_entry uuid, p_now timestamptz,
    INOUT erased bigint DEFAULT NULL, INOUT remaining bigint DEFAULT NULL
) LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM governed_memory.entries AS e
    WHERE e.scope_id = p_scope AND (p_entry IS NULL OR e.entry_id = p_entry) AND EXISTS (
        SELECT FROM governed_memory.scopes AS s
        WHERE s.scope_id = p_scope AND s.erasure IN ('pending', 'failed')
            AND (s.generation = p_generation OR s.erasure_entry IS NULL)
    );
    GET DIAGNOSTICS erased = ROW_COUNT;
    COMMIT;  -- the verification reads in a transaction of its own
    SELECT count(*) INTO remaining FROM governed_memory.entries AS e
    WHERE e.scope_id = p_scope AND (p_entry IS NULL OR e.entry_id = p_entry) AND EXISTS (
        SELECT FROM governed_memory.scopes AS s
        WHERE s.scope_id = p_scope AND s.erasure IN ('pending', 'failed')
            AND (s.generation = p_generation OR s.erasure_entry IS NULL)
    );
    IF remaining > 0 THEN
        RETURN;
    END IF;
    UPDATE governed_memory.scopes AS s
    SET enabled = s.resume, erasure = 'verified', erasure_at = p_now, updated_at = p_now
    WHERE s.scope_id = p_scope AND s.generation = p_generation AND s.erasure IN ('pending', 'failed');
    INSERT INTO governed_memory.ledger (at, operation, result, scope_id, generation, count, entry_id)
    VALUES (p_now, p_operation, 'ok', p_scope, p_generation, erased, p_entry);
END
$$
