package outbox

import (
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/plugins/internal/fieldlint/linttest"
)

// TestLintRefusesWhatStartUpRefuses: each value start-up refuses, `forwarder
// lint` refuses with the same words; the boundary values both accept.
func TestLintRefusesWhatStartUpRefuses(t *testing.T) {
	t.Parallel()
	linttest.Component{Kind: linttest.Processor, Name: "outbox", Spec: outboxProcessorSpec(), Base: "dsn: postgres://localhost/forwarder\n",
		Build: func(conf *service.ParsedConfig) error {
			_, err := newOutboxProcessorFromParsed(conf, service.MockResources())
			return err
		}}.Run(t, []linttest.Case{
		{Name: "APITypeUnknown", YAML: "api_types:\n  device-vehicle-event: VEHICLE\n  device-heartbeat: HEARTBEAT",
			Want: `field api_types: topic "device-vehicle-event" maps to "VEHICLE", want VEHICLE_EVENT or HEARTBEAT`},
		{Name: "APITypeLowerCase", YAML: "api_types:\n  device-heartbeat: heartbeat", Want: `maps to "heartbeat", want VEHICLE_EVENT or HEARTBEAT`},
		{Name: "APITypes", YAML: "api_types:\n  device-vehicle-event: VEHICLE_EVENT\n  device-heartbeat: HEARTBEAT"},
		{Name: "APITypesAndAPIType", YAML: "api_types:\n  device-heartbeat: HEARTBEAT\napi_type: HEARTBEAT", Want: "set api_types or api_type, not both"},
		{Name: "NoAPIType", YAML: "max_payload_bytes: 1", Want: "set api_types (topic to API type) or api_type"},
		{Name: "EmitCase", YAML: "api_type: HEARTBEAT\nemit: NONE", Want: `field emit: "NONE" is not supported`},
		{Name: "EmitNew", YAML: "api_type: HEARTBEAT\nemit: new", Want: `field emit: "new" is not supported`},
		{Name: "EmitNone", YAML: "api_type: HEARTBEAT\nemit: none"},
		{Name: "OrderingCase", YAML: "api_type: HEARTBEAT\nordering: Berth", Want: `field ordering (ORDERING in the shipped pipeline): "Berth" is not berth or off`},
		{Name: "OrderingFromAVariable", YAML: "api_type: HEARTBEAT\nordering: ${LINT_TEST_ORDERING:OFF}", Want: `"OFF" is not berth or off`},
		{Name: "OrderingUnknown", YAML: "api_type: HEARTBEAT\nordering: key", Want: `field ordering (ORDERING in the shipped pipeline): "key" is not berth or off`},
		{Name: "OrderingOff", YAML: "api_type: HEARTBEAT\nordering: off"},
		{Name: "MaxPayloadBytesZero", YAML: "api_type: HEARTBEAT\nmax_payload_bytes: 0", Want: "field max_payload_bytes: must be at least 1, got 0"},
		{Name: "MaxPayloadBytesOne", YAML: "api_type: HEARTBEAT\nmax_payload_bytes: 1"},
	})
}
