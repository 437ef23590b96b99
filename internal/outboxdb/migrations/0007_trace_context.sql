-- migration: online

-- Schema 7: a message's W3C trace context (docs/operations.md, "Tracing").
-- The outbox processor stores the traceparent of the span that inserted the
-- message, and every claim returns it, so that a request made hours later,
-- from a retry, joins the trace of the Kafka record it came from. NULL when
-- the message was inserted without tracing (the shipped pipeline: no
-- endpoint is set).
--
-- Online: schema-6 instances keep running while it is applied and after
-- (they neither write nor read it); the column has no default, so the ALTER
-- holds its lock for an instant, on the parent and every partition.
ALTER TABLE forward_messages ADD COLUMN trace_parent text;
