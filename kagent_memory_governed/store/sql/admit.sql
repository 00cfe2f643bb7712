-- Cost admission under the scope lock (store/admission.py describes the rules): the fence; for an explicit
-- operation the sender/agent bucket (refilled at the per-minute rate up to the burst) and its rolling minute;
-- the scope's rolling hourly units. Admitted work is recorded as used, refused work is not.
CREATE OR REPLACE FUNCTION governed_memory.admit(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_operation text, p_units integer, p_bucket uuid,
    p_burst integer, p_per_minute integer, p_per_hour integer
) RETURNS text LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s governed_memory.scopes;
    b governed_memory.buckets;
    v_refusal text;
    v_tokens double precision;
    v_recent bigint;
    v_used bigint;
BEGIN
    SELECT * INTO s FROM governed_memory.scopes WHERE scope_id = p_scope FOR UPDATE;
    v_refusal := governed_memory.fence(s, p_generation, p_now);
    IF v_refusal IS NULL AND p_bucket IS NOT NULL THEN
        INSERT INTO governed_memory.buckets AS k (bucket_id, tokens, updated_at) VALUES (p_bucket, p_burst, p_now)
        ON CONFLICT (bucket_id) DO UPDATE SET bucket_id = k.bucket_id
        RETURNING * INTO b;
        v_tokens := least(
            p_burst::double precision,
            b.tokens + greatest(extract(epoch FROM p_now - b.updated_at)::double precision, 0) * p_per_minute / 60.0
        );
        SELECT count(*) INTO v_recent FROM governed_memory.usage
        WHERE subject_id = p_bucket AND kind = 'explicit' AND at > p_now - interval '1 minute';
        IF v_recent >= p_per_minute OR v_tokens < 1.0 THEN
            v_refusal := 'rate_limited';
        END IF;
    END IF;
    IF v_refusal IS NULL AND p_units > 0 THEN
        SELECT coalesce(sum(units), 0) INTO v_used FROM governed_memory.usage
        WHERE subject_id = p_scope AND kind = 'hourly' AND at > p_now - interval '1 hour';
        IF v_used + p_units > p_per_hour THEN
            v_refusal := 'hourly_ceiling';
        END IF;
    END IF;
    IF v_refusal IS NOT NULL THEN
        INSERT INTO governed_memory.ledger (at, operation, result, reason, scope_id, generation)
        VALUES (p_now, p_operation, 'refused', v_refusal, p_scope, p_generation);
        RETURN v_refusal;
    END IF;
    IF p_bucket IS NOT NULL THEN
        UPDATE governed_memory.buckets SET tokens = v_tokens - 1.0, updated_at = p_now WHERE bucket_id = p_bucket;
        INSERT INTO governed_memory.usage (subject_id, kind, at, units) VALUES (p_bucket, 'explicit', p_now, 1);
    END IF;
    IF p_units > 0 THEN
        INSERT INTO governed_memory.usage (subject_id, kind, at, units) VALUES (p_scope, 'hourly', p_now, p_units);
    END IF;
    RETURN NULL;
END
$$;
