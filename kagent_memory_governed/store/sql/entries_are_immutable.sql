-- Entries are immutable (a trigger before UPDATE): expiry can never be extended, content never rewritten.
-- Erasure is DELETE.
CREATE OR REPLACE FUNCTION governed_memory.entries_are_immutable() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'governed_memory: entries are immutable' USING ERRCODE = 'check_violation';
END
$$;
