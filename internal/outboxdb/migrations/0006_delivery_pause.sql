-- migration: online

-- Schema 6: an operator can pause delivery for planned maintenance
-- (`forwarder outbox pause`, the console; docs/operations.md, "Planned
-- maintenance"). While a pause is in force no instance sends the platform a
-- request, not even a probe; messages are still persisted PENDING and no
-- attempt is spent. It ends at pause_until by itself (NULL: only
-- `outbox resume` ends it). It is apart from paused_until, the platform's
-- own Retry-After, which instances only ever lengthen.
--
-- Online: schema-5 instances keep running while it is applied and after
-- (they read none of it); the columns are added without a default, so the
-- ALTER holds its lock for an instant.
ALTER TABLE forward_platform_state
    ADD COLUMN pause_since  timestamptz,
    ADD COLUMN pause_until  timestamptz,
    ADD COLUMN pause_by     text,
    ADD COLUMN pause_reason text;

-- forward_delivery_pause pauses delivery until p_until (NULL: until
-- resumed), by operator p_by for p_reason, and records it in
-- forward_operator_log, in one transaction. A pause already in force keeps
-- its start and takes the new end and reason. It returns the pause's start
-- and the audit row's id. SECURITY DEFINER: the console's role changes the
-- pause and nothing else of the platform's state.
CREATE FUNCTION forward_delivery_pause(p_until timestamptz, p_by text, p_reason text)
RETURNS TABLE (since timestamptz, log_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF p_until IS NOT NULL AND p_until <= now() THEN
        RAISE EXCEPTION 'the pause would end at %, which has passed', p_until;
    END IF;
    UPDATE forward_platform_state s
    SET pause_since  = CASE WHEN s.pause_since IS NOT NULL AND (s.pause_until IS NULL OR s.pause_until > now())
                            THEN s.pause_since ELSE now() END,
        pause_until  = p_until,
        pause_by     = p_by,
        pause_reason = p_reason
    RETURNING s.pause_since INTO since;
    INSERT INTO forward_operator_log (operator, action, filter, rows)
    VALUES (p_by, 'pause',
            CASE WHEN p_until IS NULL THEN 'until resumed' ELSE 'until ' || to_char(p_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') END
            || CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END,
            0)
    RETURNING id INTO log_id;
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION forward_delivery_pause(timestamptz, text, text) FROM PUBLIC;

-- forward_delivery_resume ends the pause now, by operator p_by, and records
-- it. It returns whether a pause was in force and the audit row's id (NULL
-- when none was: nothing is recorded).
CREATE FUNCTION forward_delivery_resume(p_by text)
RETURNS TABLE (was_paused boolean, log_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE forward_platform_state s
    SET pause_until = now()
    WHERE s.pause_since IS NOT NULL AND (s.pause_until IS NULL OR s.pause_until > now());
    was_paused := FOUND;
    IF was_paused THEN
        INSERT INTO forward_operator_log (operator, action, filter, rows)
        VALUES (p_by, 'resume', '', 0)
        RETURNING id INTO log_id;
    END IF;
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION forward_delivery_resume(text) FROM PUBLIC;
