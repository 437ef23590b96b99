package outboxcli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/forwarder/forwarder/internal/console"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

func pauseCommand() *cli.Command {
	return &cli.Command{
		Name:      "pause",
		Usage:     "Pause delivery on every instance (planned maintenance of the platform) until a time or until resumed",
		UsageText: "forwarder outbox pause [--until T] [--reason R] [--operator O]",
		Description: `While delivery is paused no instance sends the platform a request, not
even the circuit breaker's probes. Kafka is still consumed: every message is
persisted PENDING and waits, without spending an attempt. The pause is kept
in PostgreSQL, so every instance follows it (within a second) and it
survives restarts. It ends by itself at --until, or at "outbox resume";
delivery then ramps up from one request at a time, as after an outage.

--until is a time (RFC 3339, 2026-12-02T06:00:00Z) or a duration from now
(90m, 2h30m; at least 1s); without it the pause lasts until resumed. Pausing again while
paused keeps the pause's start and replaces its end and reason. Each pause
and resume leaves a row in forward_operator_log; "outbox stats", the console
and the metric forwarder_delivery_paused show it.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "until", Usage: "when the pause ends by itself: an RFC 3339 time or a duration from now (default: until resumed)"},
			&cli.StringFlag{Name: "reason", Usage: "why, for whoever looks at the pause (outbox stats, the console)"},
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			until, err := outboxdb.ParsePauseEnd(c.String("until"), time.Now())
			if err != nil {
				return refusef(c, "--until: %v", err)
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				since, err := outboxdb.PauseDelivery(ctx, pool, until, operator, c.String("reason"))
				if err != nil {
					return err
				}
				writePause(c.App.Writer, since, until, operator)
				return nil
			})
		},
	}
}

func resumeCommand() *cli.Command {
	return &cli.Command{
		Name:      "resume",
		Usage:     "End a pause of delivery now",
		UsageText: "forwarder outbox resume [--operator O]",
		Description: `Every instance sends again within a second, ramping up from one request at
a time as after an outage. Leaves a row in forward_operator_log. It fails
when delivery is not paused.`,
		Flags: []cli.Flag{
			operatorFlag(),
		},
		Action: func(c *cli.Context) error {
			operator, err := operatorName(c)
			if err != nil {
				return refusef(c, "%v", err)
			}
			return withPool(c, func(ctx context.Context, pool *pgxpool.Pool) error {
				was, err := outboxdb.ResumeDelivery(ctx, pool, operator)
				if err != nil {
					return err
				}
				if !was {
					return failf(c, "delivery is not paused (outbox stats shows the last pause)")
				}
				fmt.Fprintf(c.App.Writer, "delivery resumed by %s: every instance sends again within a second, ramping up\n", console.SafeLine(operator))
				return nil
			})
		},
	}
}

func writePause(w io.Writer, since, until time.Time, operator string) {
	end := "until resumed (outbox resume)"
	if !until.IsZero() {
		end = "until " + until.UTC().Format(time.RFC3339) + " (or outbox resume)"
	}
	fmt.Fprintf(w, "delivery paused by %s since %s, %s: every instance stops sending within a second; messages are still persisted PENDING\n",
		console.SafeLine(operator), since.UTC().Format(time.RFC3339), end)
}
