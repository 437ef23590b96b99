// Package all registers every forwarder plugin with the global Benthos
// environment. Import it for its side effects.
package all

import (
	// Each import registers its components in init.
	_ "github.com/forwarder/forwarder/plugins/deadletter"
	_ "github.com/forwarder/forwarder/plugins/httpforwarder"
	_ "github.com/forwarder/forwarder/plugins/kafka"
	_ "github.com/forwarder/forwarder/plugins/mapping"
	_ "github.com/forwarder/forwarder/plugins/outbox"
	_ "github.com/forwarder/forwarder/plugins/outboxretry"
	_ "github.com/forwarder/forwarder/plugins/prometheus"
	_ "github.com/forwarder/forwarder/plugins/tracing"
)
