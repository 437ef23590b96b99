package outboxdb

import (
	"context"
	"fmt"
	"strings"
)

// idleNotice starts the payload of the notification on NotifyChannel with
// which a dispatcher says it looked for due rows and found none while it
// had room for more (AnnounceIdle).
const idleNotice = "idle "

// AnnounceIdle tells the other dispatchers of the database that claimer
// found nothing due to claim with room to spare. A dispatcher that hears it
// stops claiming the rows its result writes release for itself (chained
// dispatch) for a while: they are made due instead, for any instance, so a
// key's backlog does not wait behind one instance's requests while another
// has nothing to send.
func AnnounceIdle(ctx context.Context, q Querier, claimer string) error {
	if _, err := q.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, idleNotice+claimer); err != nil {
		return fmt.Errorf("announcing an idle dispatcher: %w", err)
	}
	return nil
}

// IdleNotice reads a notification's payload on NotifyChannel: ok when it is
// AnnounceIdle's, with the claimer that sent it.
func IdleNotice(payload string) (claimer string, ok bool) {
	return strings.CutPrefix(payload, idleNotice)
}
