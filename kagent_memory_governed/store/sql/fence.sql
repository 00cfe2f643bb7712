-- The consent fence (consent.py describes it): why work admitted under a generation is refused now, else NULL.
CREATE OR REPLACE FUNCTION governed_memory.fence(s governed_memory.scopes, p_generation bigint, p_now timestamptz)
RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN s.scope_id IS NULL OR s.generation = 0 THEN 'consent_missing'
        WHEN NOT s.enabled THEN 'consent_disabled'
        WHEN s.consent_expires_at IS NOT NULL AND s.consent_expires_at <= p_now THEN 'consent_expired'
        WHEN p_generation <> s.generation THEN 'consent_stale'
    END
$$;
