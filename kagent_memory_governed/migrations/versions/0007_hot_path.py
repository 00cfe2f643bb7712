"""The hot path in one round trip: the consent fence, search, admission, write and the conversation turns
as database functions, each called as one statement in its own transaction; and an erasure's delete,
verification and settle as one procedure call, committing between them.

Why functions: a statement with CTEs sees one snapshot, taken before any lock wait, so a writer counting
live entries after waiting for the scope lock would count on a stale snapshot (two concurrent writers
filled a scope past its cap that way). In PL/pgSQL every statement takes a fresh snapshot at READ
COMMITTED, so ``SELECT ... FOR UPDATE`` followed by a count sees what earlier lock holders committed,
exactly as the multi-statement transactions they replace did; search keeps its one statement, so one
snapshot decides the fence and the entries. A refusal is returned, not raised: its ledger row commits
with the call.

Vectors arrive as ``vector[]`` in pgvector's binary format (``database.Vectors``). No statement is
assembled from input: every value is a parameter.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The fence (consent.py's contract): why work admitted under a generation is refused now, else NULL.
FENCE = """
CREATE FUNCTION governed_memory.fence(s governed_memory.scopes, p_generation bigint, p_now timestamptz)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN s.scope_id IS NULL OR s.generation = 0 THEN 'consent_missing'
        WHEN NOT s.enabled THEN 'consent_disabled'
        WHEN s.consent_expires_at IS NOT NULL AND s.consent_expires_at <= p_now THEN 'consent_expired'
        WHEN p_generation <> s.generation THEN 'consent_stale'
    END
$$
"""

# The top-k live entries for each query vector, fence and entries in one snapshot, and one ledger row.
SEARCH = """
CREATE FUNCTION governed_memory.search(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_queries vector[], p_top_k integer,
    p_max_distance double precision
) RETURNS TABLE (
    refusal text, query integer, entry_id uuid, fact text, created_at timestamptz, expires_at timestamptz,
    distance double precision
) LANGUAGE plpgsql AS $$
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
        SELECT q.n, e.entry_id, e.text, e.created_at, e.expires_at, e.embedding <=> q.v AS distance
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
$$
"""

# Store facts under the scope lock: fence, count live entries after the lock, keep a fact equal to a live
# entry as that entry (R36), refuse past the cap (never evict), insert the rest, one ledger row.
WRITE = """
CREATE FUNCTION governed_memory.write(
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
"""

# Cost admission under the scope lock (admission.py describes the rules): the fence; for an explicit
# operation the sender/agent bucket (refilled at the per-minute rate up to the burst) and its rolling
# minute; the scope's rolling hourly units. Admitted work is recorded as used, refused work is not.
ADMIT = """
CREATE FUNCTION governed_memory.admit(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_operation text, p_units integer, p_bucket uuid,
    p_burst integer, p_per_minute integer, p_per_hour integer
) RETURNS text LANGUAGE plpgsql AS $$
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
$$
"""

# A turn admitted under the current consent, recorded once; how many of its session's turns under that
# generation now await auto-save. A fenced-off turn is not recorded (R36).
RECORD_TURN = """
CREATE FUNCTION governed_memory.record_turn(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_session uuid, p_invocation uuid, p_recalled boolean
) RETURNS TABLE (refusal text, waiting bigint) LANGUAGE plpgsql AS $$
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
$$
"""

# Take, once, the candidate turns of a session admitted under the current generation; the session's turns of
# any other generation are discarded, so nothing said before an erasure or a withdrawal is collected (R36).
COLLECT_TURNS = """
CREATE FUNCTION governed_memory.collect_turns(
    p_scope uuid, p_generation bigint, p_now timestamptz, p_session uuid, p_candidates uuid[]
) RETURNS TABLE (refusal text, invocation_ref uuid, recalled boolean) LANGUAGE plpgsql AS $$
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
$$
"""

# What an erasure fenced at a generation erases: delete, commit, verify in a fresh transaction, then settle the
# scope with its ledger row, in one call. It deletes only while that erasure's fence stands: its scope is
# unfinished at that generation, or at a later one that erases every entry (forgetting one entry is refused
# while an erasure is unfinished, so a later fence always covers an earlier target). Once the scope is
# settled, its entries may have been written under a new grant, and no earlier erasure may touch them. Rows
# left after the delete come back as ``remaining``, the scope unsettled: the caller records the failure.
CLEAR = """
CREATE PROCEDURE governed_memory.clear(
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
"""

_FUNCTIONS = {
    "fence(governed_memory.scopes, bigint, timestamptz)": FENCE,
    "search(uuid, bigint, timestamptz, vector[], integer, double precision)": SEARCH,
    "write(uuid, bigint, timestamptz, text[], vector[], integer, bigint)": WRITE,
    "admit(uuid, bigint, timestamptz, text, integer, uuid, integer, integer, integer)": ADMIT,
    "record_turn(uuid, bigint, timestamptz, uuid, uuid, boolean)": RECORD_TURN,
    "collect_turns(uuid, bigint, timestamptz, uuid, uuid[])": COLLECT_TURNS,
}
_PROCEDURES = {"clear(uuid, bigint, text, uuid, timestamptz, bigint, bigint)": CLEAR}


def upgrade() -> None:
    for definition in [*_FUNCTIONS.values(), *_PROCEDURES.values()]:
        op.execute(definition)


def downgrade() -> None:
    for signature in _PROCEDURES:
        op.execute(f"DROP PROCEDURE governed_memory.{signature}")
    for signature in reversed(_FUNCTIONS):
        op.execute(f"DROP FUNCTION governed_memory.{signature}")
