-- Entries are immutable (a trigger before UPDATE): expiry can never be extended, content never rewritten.
-- Erasure is DELETE. The one change allowed is sealing an entry stored in plain text by an earlier version
-- (``migrate``, migration 0011): the same entry, its plain text and embedding replaced by their ciphertext.
CREATE OR REPLACE FUNCTION governed_memory.entries_are_immutable() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.sealed IS NULL AND NEW.sealed IS NOT NULL AND NEW.plain_text IS NULL AND NEW.plain_embedding IS NULL
        AND NEW.scope_id = OLD.scope_id AND NEW.entry_id = OLD.entry_id AND NEW.generation = OLD.generation
        AND NEW.created_at = OLD.created_at AND NEW.expires_at = OLD.expires_at THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'governed_memory: entries are immutable' USING ERRCODE = 'check_violation';
END
$$;
