-- What an erasure fenced at a generation erases: delete, commit, verify in a fresh transaction, then settle the
-- scope with its ledger row, in one call. It deletes only while that erasure's fence stands: its scope is
-- unfinished at that generation, or at a later one that erases every entry (forgetting one entry is refused
-- while an erasure is unfinished, so a later fence always covers an earlier target). Once the scope is
-- settled, its entries may have been written under a new grant, and no earlier erasure may touch them. Rows
-- left after the delete come back as ``remaining``, the scope unsettled: the caller records the failure.
-- ``p_keys_destroyed``: the caller destroyed the erased entries' keys and verified them gone
-- (``entries_deleted_after_keys``); a caller that does not know it (an earlier release's call, whose INOUT
-- arguments now fill it with NULL) deletes nothing: the trigger refuses, and its erasure stays unfinished.
-- A procedure: it commits between its steps, so it is called outside any transaction block.
CREATE OR REPLACE PROCEDURE governed_memory.clear(
    p_scope uuid, p_generation bigint, p_operation text, p_entry uuid, p_now timestamptz, p_keys_destroyed boolean,
    INOUT erased bigint DEFAULT NULL, INOUT remaining bigint DEFAULT NULL
) LANGUAGE plpgsql AS $$
BEGIN
    -- the pinned search_path, set for each of its transactions: a procedure that commits cannot carry SET
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    PERFORM pg_catalog.set_config('governed_memory.keys_destroyed', CASE WHEN p_keys_destroyed THEN 'on' END, true);
    DELETE FROM governed_memory.entries AS e
    WHERE e.scope_id = p_scope AND (p_entry IS NULL OR e.entry_id = p_entry) AND EXISTS (
        SELECT FROM governed_memory.scopes AS s
        WHERE s.scope_id = p_scope AND s.erasure IN ('pending', 'failed')
            AND (s.generation = p_generation OR s.erasure_entry IS NULL)
    );
    GET DIAGNOSTICS erased = ROW_COUNT;
    COMMIT;  -- the verification reads in a transaction of its own
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
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
$$;
