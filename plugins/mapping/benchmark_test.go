package mapping

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/mappingfile"
)

// BenchmarkMappingFileVehicleEvent maps the documented vehicle event (mappings/README.md) with the
// shipped mapping, one message per batch as the forwarder sends them.
func BenchmarkMappingFileVehicleEvent(b *testing.B) {
	benchmarkMappingFile(b, "../../mappings/vehicle_event.blobl", `{"messageId": "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012", "itemId": 73421, "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1, "inoutTime": 1779330600000, "plateCredible": 0.854, "pictures": [{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"}, {"picType": 3, "picUrl": "/jieshun/2026/05/21/P1001/b.jpg"}]}`)
}

// BenchmarkMappingFileHeartbeat maps the documented heartbeat (mappings/README.md) with the
// shipped mapping.
func BenchmarkMappingFileHeartbeat(b *testing.B) {
	benchmarkMappingFile(b, "../../mappings/heartbeat.blobl", `{"messageId": "0d5c8a9e-3f1b-4c55-8b52-2f7e1a9c4d60", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012", "captureTime": 1779330900000, "picType": 3, "picUrl": "jieshun/2026/05/21/P1001/hb.jpg"}`)
}

func benchmarkMappingFile(b *testing.B, path, event string) {
	p, err := newMappingFile(path, 0, mappingfile.OSFiles{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	in := []byte(event)
	b.ReportAllocs()
	for b.Loop() {
		out, err := p.ProcessBatch(b.Context(), service.MessageBatch{service.NewMessage(in)})
		if err != nil {
			b.Fatal(err)
		}
		if err := out[0][0].GetError(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPercentRound is the credibility rounding alone.
func BenchmarkPercentRound(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := mappingfile.PercentRound("0.854"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTsFormatPlatform is the event time formatting alone, with the
// zone cached.
func BenchmarkTsFormatPlatform(b *testing.B) {
	exec, err := bloblang.Parse(`root = this.ts_format_platform("2006-01-02 15:04:05")`)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := exec.Query(int64(1779330600)); err != nil {
			b.Fatal(err)
		}
	}
}
