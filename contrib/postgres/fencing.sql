-- A PostgreSQL table as a fenced resource for lead-exec's FENCING_TOKEN.
--
-- lead_exec_fence holds, per resource, the highest token a committed write carried.
-- lead_exec_fence(resource, token), called inside the writer's own transaction, raises
-- SQLSTATE 'FENCE' if a higher token was accepted, so the whole transaction rolls back.
--
--   BEGIN;
--   SELECT lead_exec_fence('settlement', $FENCING_TOKEN);
--   INSERT INTO settlements ...;
--   COMMIT;
--
-- Safe at READ COMMITTED (the default) and above: the conditional upsert locks the
-- resource's row until the writer commits or rolls back, a writer queued behind that lock
-- compares against the row as the other one committed it, and no write of the transaction
-- can commit without going through the lock. Run this file once; running it again keeps
-- every mark.

CREATE TABLE IF NOT EXISTS lead_exec_fence (
    resource text   PRIMARY KEY,
    highest  bigint NOT NULL CHECK (highest > 0)
);

CREATE OR REPLACE FUNCTION lead_exec_fence(p_resource text, p_token bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    accepted bigint;
BEGIN
    -- One statement both compares and raises the mark, under the row lock: an equal token
    -- (the same term writing again) passes, a lower one updates nothing.
    INSERT INTO lead_exec_fence AS f (resource, highest)
    VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE
        SET highest = EXCLUDED.highest
        WHERE f.highest <= EXCLUDED.highest
    RETURNING f.highest INTO accepted;
    IF accepted IS NULL THEN
        SELECT highest INTO accepted FROM lead_exec_fence WHERE resource = p_resource;
        RAISE EXCEPTION 'stale fencing token % for %: % was accepted', p_token, p_resource, accepted
            USING ERRCODE = 'FENCE',
                  HINT = 'a newer term has written; this writer must stop';
    END IF;
    RETURN accepted;
END
$$;
