// Package bigmsg makes camera messages of an exact size, for the memory
// tests and the memory benchmark: a good vehicle event whose first picture
// URL is padded, so that the mapping passes the bulk on and the platform
// request is about as large as the message.
package bigmsg

import (
	"bytes"
	"fmt"
	"regexp"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
)

// MaxSize is the largest message the shipped pipeline consumes
// (max_payload_bytes) and the largest request body the mock platform takes.
const MaxSize = 16 << 20

// Size is the size of the "16 MiB messages" of the memory tests: the
// request body adds the credentials to what the mapping makes of the
// message, so a message of exactly MaxSize gives a body a little larger
// than the mock platform takes.
const Size = MaxSize - 4<<10

var picURL = regexp.MustCompile(`"picUrl"\s*:\s*"[^"]*`)

// Vehicle returns the next good vehicle event of src with a messageId and
// a picture, grown to exactly size bytes by a query string on its first picture URL.
func Vehicle(src *eventgen.Source, size int) (eventgen.Message, error) {
	for range 1000 {
		m := src.Next()
		if m.Kind != eventgen.Vehicle || m.Flaw != eventgen.FlawNone || m.MessageID == "" {
			continue
		}
		loc := picURL.FindIndex(m.Value)
		if loc == nil {
			continue // an event without pictures
		}
		const sep = "?pad="
		pad := size - len(m.Value) - len(sep)
		if pad < 0 {
			return m, fmt.Errorf("bigmsg: a vehicle event is %d bytes, more than %d", len(m.Value), size)
		}
		v := make([]byte, 0, size)
		v = append(v, m.Value[:loc[1]]...)
		v = append(v, sep...)
		v = append(v, bytes.Repeat([]byte{'x'}, pad)...)
		v = append(v, m.Value[loc[1]:]...)
		m.Value = v
		return m, nil
	}
	return eventgen.Message{}, fmt.Errorf("bigmsg: no good vehicle event in 1000 messages")
}
