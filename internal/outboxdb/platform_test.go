package outboxdb_test

import (
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// TestPausePlatformIsNeverShorterThanAsked: a Retry-After pause shared in
// the database ends no sooner than its length after the caller asked for
// it, whatever fraction of a millisecond the length carries (the statement
// truncated it to whole milliseconds: the pause shared after a 429 ended up
// to a millisecond early).
func TestPausePlatformIsNeverShorterThanAsked(t *testing.T) {
	t.Parallel()
	b := setupClaimTest(t)
	for _, d := range []time.Duration{
		time.Second + 999*time.Microsecond,
		5*time.Second + 999_600*time.Nanosecond,
		10*time.Second + 1,
	} {
		asked := time.Now()
		until, err := outboxdb.PausePlatform(b.Ctx, b.Pool, d)
		if err != nil {
			t.Fatal(err)
		}
		if until.Before(asked.Add(d)) {
			t.Errorf("a pause of %v asked for ends %v after it was asked: shorter", d, until.Sub(asked))
		}
	}
}
