package mapping

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/mappingfile"
)

const hostilePicture = `{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"}`

// hostileVehicleEvent returns a vehicle event of about size bytes that is
// valid but built to be expensive: its credibility, its itemId and its
// pictures array are each a quarter of it, and an unknown field holds the
// last quarter as arrays nested 100 deep. Every part goes through the
// mapping (none fails early).
func hostileVehicleEvent(size int) []byte {
	quarter := size / 4
	var b bytes.Buffer
	b.Grow(size + 1024)
	b.WriteString(`{"messageId": "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012", "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1, "inoutTime": 1779330600000`)
	// 0.5749999…: the digits far from the rounding position must not be
	// worked on, but the rounding must still see the first ones.
	b.WriteString(`, "plateCredible": 0.57`)
	b.WriteString(strings.Repeat("4", quarter))
	b.WriteString(`, "itemId": 1`)
	b.WriteString(strings.Repeat("7", quarter))
	b.WriteString(`, "pictures": [` + hostilePicture)
	for range quarter / (len(hostilePicture) + 2) {
		b.WriteString(", " + hostilePicture)
	}
	nested := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	b.WriteString(`], "unknownNested": [` + nested)
	for range quarter / (len(nested) + 1) {
		b.WriteString("," + nested)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// TestVehicleEventHostileIsLinear maps hostile vehicle events of 1 MiB and
// 16 MiB with the shipped mapping and checks that the bigger one costs about
// 16 times as much. What a message costs depends on the machine, how the cost
// grows with its size does not, so both bounds are ratios, of work counted by
// the process rather than of wall-clock time, which other processes change:
//
//   - bytes allocated: at most 24 times (a linear cost gives 16 to 18);
//   - CPU time of the process (the mapping and the garbage collector): at
//     most 64 times. A linear cost gives 16 to 25 (a 16 MiB working set
//     misses the caches and wakes the collector more often), a quadratic one
//     256. The digit-by-digit credibility this replaced took hours at 16 MiB;
//     the test gives up on a run well before.
//
// Not parallel: it reads the whole process's counters.
func TestVehicleEventHostileIsLinear(t *testing.T) {
	p, err := newMappingFile("../../mappings/vehicle_event.blobl", 0, mappingfile.OSFiles{}, service.MockResources().Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	small, large := hostileVehicleEvent(1<<20), hostileVehicleEvent(16<<20)

	// The least of a few runs: a busy machine can only make a run cost more.
	const maxCPURatio, maxBytesRatio = 64, 24
	smallCost, _ := leastCost(t, p, small, 5, 0)
	// A mapping cannot be cancelled: a run still going at four times the
	// bound in wall-clock time (room for a machine that gives this process
	// a quarter of a core) fails the test at once and is left to finish.
	largeCost, mapped := leastCost(t, p, large, 2, 4*maxCPURatio*smallCost.cpu)

	// The mapping is right, not only cheap.
	var out struct {
		ItemID      string            `json:"item_id"`
		Credibility string            `json:"credibility"`
		Pictures    []json.RawMessage `json:"pictures"`
	}
	if err := json.Unmarshal(mapped, &out); err != nil {
		t.Fatal(err)
	}
	if out.Credibility != "57" {
		t.Errorf("credibility %q, want 57 (0.57444… × 100 rounded half up)", out.Credibility)
	}
	if want := 1 + (16<<20)/4; len(out.ItemID) != want || strings.Trim(out.ItemID[1:], "7") != "" {
		t.Errorf("item_id of %d digits, want the %d digits as written", len(out.ItemID), want)
	}
	if want := 1 + (16<<20)/4/(len(hostilePicture)+2); len(out.Pictures) != want {
		t.Errorf("%d pictures mapped, want the event's %d", len(out.Pictures), want)
	}

	t.Logf("1 MiB: %+v; 16 MiB: %+v", smallCost, largeCost)
	if r := float64(largeCost.bytes) / float64(smallCost.bytes); r > maxBytesRatio {
		t.Errorf("the 16 MiB event allocated %.1f times the bytes of the 1 MiB one, want at most %d (linear: about 16)", r, maxBytesRatio)
	}
	if r := float64(largeCost.cpu) / float64(smallCost.cpu); r > maxCPURatio {
		t.Errorf("the 16 MiB event took %.1f times the CPU time of the 1 MiB one, want at most %d (linear: about 16)", r, maxCPURatio)
	}
}

// cost is what mapping one event cost the process.
type cost struct {
	cpu   time.Duration // user and system time of the whole process
	bytes uint64        // allocated
}

// leastCost maps event runs times and returns the least CPU time and the
// least bytes allocated of the runs, and the mapped body. A run taking longer
// than timeout (when not 0) in wall-clock time fails the test.
func leastCost(t *testing.T, p *mappingFileProc, event []byte, runs int, timeout time.Duration) (cost, []byte) {
	t.Helper()
	var least cost
	var mapped []byte
	for i := range runs {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cpuBefore := processCPU(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			mapped = mapHostile(t, p, event)
		}()
		var expired <-chan time.Time
		if timeout > 0 {
			expired = time.After(timeout)
		}
		select {
		case <-done:
		case <-expired:
			t.Fatalf("mapping a %d MiB hostile event took more than %v: its cost is not linear in its size", len(event)>>20, timeout)
		}
		c := cost{cpu: processCPU(t) - cpuBefore}
		runtime.ReadMemStats(&after)
		c.bytes = after.TotalAlloc - before.TotalAlloc
		if i == 0 || c.cpu < least.cpu {
			least.cpu = c.cpu
		}
		if i == 0 || c.bytes < least.bytes {
			least.bytes = c.bytes
		}
	}
	return least, mapped
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mapHostile maps event and returns the mapped body, failing on any error.
func mapHostile(t *testing.T, p *mappingFileProc, event []byte) []byte {
	out, err := p.ProcessBatch(t.Context(), service.MessageBatch{service.NewMessage(event)})
	if err != nil {
		t.Error(err)
		return nil
	}
	if err := out[0][0].GetError(); err != nil {
		t.Errorf("mapping error: %.200v", err)
		return nil
	}
	b, err := out[0][0].AsBytes()
	if err != nil {
		t.Error(err)
	}
	return b
}

// BenchmarkPercentRoundHuge rounds a credibility of 16 MiB digits, as a
// string and as a JSON number, and one with a huge exponent.
func BenchmarkPercentRoundHuge(b *testing.B) {
	digits := "0.57" + strings.Repeat("4", 16<<20)
	for name, in := range map[string]any{
		"String16MiB":     digits,
		"JSONNumber16MiB": json.Number(digits),
		"Exponent":        json.Number("1e999999999"),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(fmt.Sprint(in))))
			for b.Loop() {
				if got, err := mappingfile.PercentRound(in); err != nil || (got != 57 && got < 100) {
					b.Fatalf("got %d, %v", got, err)
				}
			}
		})
	}
}

// BenchmarkMappingFileHostileEvent maps 16 MiB vehicle events with the
// shipped mapping: the hostile valid event, and one whose 16 MiB credibility
// string is not a number (a mapping error).
func BenchmarkMappingFileHostileEvent(b *testing.B) {
	p, err := newMappingFile("../../mappings/vehicle_event.blobl", 0, mappingfile.OSFiles{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	notNumber := []byte(`{"messageId": "m", "deviceId": "d", "parkCode": "p", "berthCode": "b", "plateNo": "x", "inoutType": 1, "inoutTime": 1779330600000, "plateCredible": "0.5` + strings.Repeat("4", 16<<20) + `x"}`)
	for name, event := range map[string][]byte{
		"Valid16MiB":                 hostileVehicleEvent(16 << 20),
		"CredibilityNotANumber16MiB": notNumber,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(event)))
			for b.Loop() {
				out, err := p.ProcessBatch(b.Context(), service.MessageBatch{service.NewMessage(event)})
				if err != nil {
					b.Fatal(err)
				}
				merr := out[0][0].GetError()
				if (name == "Valid16MiB") != (merr == nil) {
					b.Fatalf("mapping error %v", merr)
				}
			}
		})
	}
}
