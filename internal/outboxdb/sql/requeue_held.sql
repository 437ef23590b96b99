-- Whether p, one of the rows "picked" that a statement requeues, is held
-- behind another row of its ordering key (docs/architecture.md,
-- "Ordering"): its key has a head (a row due or in flight that is not
-- held), a blocked row not requeued with it, or an earlier (lower id) row
-- requeued with it. Included by admin_requeue.sql and compensate.sql, so an
-- operator's requeue and the automatic one keep a key's rows in id order
-- alike.
EXISTS (SELECT 1
        FROM forward_deliveries o
        WHERE o.ordering_key = p.ordering_key
          AND (o.status IN ('PENDING', 'IN_PROGRESS') OR o.order_blocked) -- order_idx's predicate
          AND o.id <> p.id
          AND ((o.status IN ('PENDING', 'IN_PROGRESS') AND NOT o.order_held)
               OR (o.order_blocked AND o.id NOT IN (SELECT q.id FROM picked q))))
OR EXISTS (SELECT 1
           FROM picked q
           WHERE q.ordering_key = p.ordering_key AND q.id < p.id)
