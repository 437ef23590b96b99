-- Each held row's token by id ($1 ids, $2 tokens, pairwise), in one jsonb
-- object that the statement looks each of its rows up in rather than joins:
-- one probe and one lookup a row whatever the statistics say (record.sql).
-- Included as the body of a MATERIALIZED CTE named tokens, so that it is
-- computed once, not again for each row, and read as a value,
-- (SELECT by_id FROM tokens), never joined: joined, each row carries a copy
-- of the whole object (n copies of n entries; in renew.sql, 190 MB sorted on
-- disk for 2 000 rows). Included by release.sql, renew.sql,
-- deadletter_mark.sql and deadletter_release.sql.
SELECT jsonb_object_agg(held.id::text, held.token) AS by_id
FROM unnest($1::bigint[], $2::text[]) AS held (id, token)
