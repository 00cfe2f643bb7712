-- Store sealed entries under the scope lock: fence; read the scope's live entries once, after the lock; refuse
-- if the caller's keyring misses one of them (``keyring_stale``: it fetches the keyring again and retries, so a
-- fact equal to a live entry is always recognized, R36); keep each new entry whose fact a live entry holds as
-- that entry (``p_same``: entries the caller's keyring says hold the fact of the new entry at ``p_same_of``, its
-- position in ``p_ids``); refuse past the cap (never evict); insert the rest; one ledger row. Only ciphertexts,
-- ids and times reach the database.
CREATE OR REPLACE FUNCTION governed_memory.write(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_ids uuid[], p_sealed bytea[], p_same_of integer[],
    p_same uuid[], p_known uuid[], p_cap integer, p_lifetime_seconds bigint
) RETURNS TABLE (refusal text, entry_id uuid) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    v_refusal text;
    v_live uuid[];
    v_held uuid[];
    v_new bigint;
BEGIN
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope FOR UPDATE;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NULL THEN
        -- a statement of its own, after the lock: it sees what earlier lock holders committed
        -- the scope's rows by the primary key alone, then the live ones (search.sql says why)
        WITH scoped AS MATERIALIZED (
            SELECT e.entry_id, e.expires_at FROM governed_memory.entries AS e WHERE e.scope_id = p_scope
        )
        SELECT coalesce(array_agg(scoped.entry_id), '{}') INTO v_live FROM scoped WHERE scoped.expires_at > p_now;
        IF NOT v_live <@ p_known THEN
            RETURN QUERY SELECT 'keyring_stale'::text, NULL::uuid;
            RETURN;
        END IF;
        -- for each new entry, the live entry that holds its fact, if any
        SELECT array_agg(held.id ORDER BY u.i) INTO v_held
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, i) LEFT JOIN LATERAL (
            SELECT (array_agg(c.id ORDER BY c.id))[1] AS id FROM unnest(p_same_of, p_same) AS c(i, id)
            WHERE c.i = u.i AND c.id = ANY (v_live)
        ) AS held ON true;
        SELECT count(*) INTO v_new FROM unnest(v_held) AS h(id) WHERE h.id IS NULL;
        IF v_new > 0 AND cardinality(v_live) + v_new > least(s.entry_cap, p_cap) THEN
            v_refusal := 'entry_cap_reached';
        END IF;
    END IF;
    IF v_refusal IS NOT NULL THEN
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation)
        VALUES (p_now, 'write', 'refused', v_refusal, p_scope, p_generation);
        RETURN QUERY SELECT v_refusal, NULL::uuid;
        RETURN;
    END IF;
    INSERT INTO governed_memory.ledger (at, operation, result, scope_id, generation, count)
    VALUES (p_now, 'write', 'ok', p_scope, p_generation, v_new);
    INSERT INTO governed_memory.entries AS n (scope_id, entry_id, sealed, generation, created_at, expires_at)
    SELECT p_scope, u.id, u.sealed, p_generation, p_now,
        p_now + make_interval(secs => least(p_lifetime_seconds, s.max_expiry_seconds))
    FROM unnest(p_ids, p_sealed, v_held) AS u(id, sealed, held)
    WHERE u.held IS NULL;
    -- each new entry in the caller's order: its own id, or the live entry that holds its fact
    RETURN QUERY SELECT NULL::text, coalesce(u.held, u.id) FROM unnest(p_ids, v_held) WITH ORDINALITY AS u(id, held, i)
    ORDER BY u.i;
END
$$;
