-- Entries are deleted only by an erasure or a sweep that has destroyed their keys first and verified them gone (a
-- trigger before DELETE, once a statement): the caller says so for its transaction
-- (``governed_memory.keys_destroyed``). Code that deletes rows without destroying keys, such as a replica of a
-- release before sealing serving beside a migrated database, is refused; its erasure stays unfinished, and a
-- replica of this release completes it, keys first.
CREATE OR REPLACE FUNCTION governed_memory.entries_deleted_after_keys() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.current_setting('governed_memory.keys_destroyed', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'governed_memory: entries are deleted after their keys' USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NULL;
END
$$;
