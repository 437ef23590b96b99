package mapping

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	// The shipped mappings read PLATFORM_TZ with env(), an io component.
	_ "github.com/redpanda-data/benthos/v4/public/components/io"
)

// BenchmarkMappingFileVehicleEvent maps the CONTRACT §4 vehicle event with the
// shipped mapping, one message per batch as the forwarder sends them.
func BenchmarkMappingFileVehicleEvent(b *testing.B) {
	p, err := newMappingFile("../../mappings/vehicle_event.blobl", 0, osFiles{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	in := []byte(`{"messageId": "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11", "deviceId": "CAM-0001", "parkCode": "P1001", "berthCode": "B-012", "itemId": 73421, "plateNo": "粤B12345", "plateColor": 1, "inoutType": 1, "inoutTime": 1779330600000, "plateCredible": 0.854, "pictures": [{"picType": 1, "picUrl": "jieshun/2026/05/21/P1001/a.jpg"}, {"picType": 3, "picUrl": "/jieshun/2026/05/21/P1001/b.jpg"}]}`)
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
		if _, err := PercentRound("0.854"); err != nil {
			b.Fatal(err)
		}
	}
}
