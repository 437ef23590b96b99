package kafka

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/forwarder/forwarder/internal/pluginconf"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

// The lint rules of the fields that the constructors check beyond
// Benthos's schema, through the constructors' own checks (the check*
// functions here), so that `forwarder lint` refuses what start-up would,
// with the same words.

// listLintRule is the rule of a list field whose entries may hold several
// comma-separated values (parseList). A list with an empty entry is passed:
// an unset variable leaves one.
func listLintRule(field, what string) string {
	return fieldlint.Rule(func(v any) []string {
		list, ok := v.([]any)
		if !ok {
			return nil
		}
		raw := make([]string, len(list))
		for i, e := range list {
			if raw[i], ok = e.(string); !ok || raw[i] == "" {
				return nil
			}
		}
		if _, err := listValues(field, what, raw); err != nil {
			return []string{err.Error()}
		}
		return nil
	})
}

// bytesLintRule is the rule of a byte size field (parseBytes).
func bytesLintRule(field string, max uint64, bounds string) string {
	return fieldlint.String(func(s string) error {
		_, err := byteSize(field, s, max, bounds)
		return err
	})
}

func int32BytesLintRule(field string) string {
	return bytesLintRule(field, math.MaxInt32, "between 1B and 2147483647B (2GiB less a byte)")
}

func brokerIOLintRule(field string) string {
	return bytesLintRule(field, maxBrokerIO, "between 1B and 1GiB, the largest request or response franz-go handles")
}

// positiveLintRule is the rule of a duration that must be above zero.
func positiveLintRule(field string) string {
	return fieldlint.Duration(field, checkPositive(field))
}

// groupTimeoutLintRule is the rule of session_timeout and
// rebalance_timeout.
func groupTimeoutLintRule(field string) string {
	return fieldlint.Duration(field, checkGroupTimeout(field))
}

var (
	metadataMaxAgeLintRule    = fieldlint.Duration(kfFieldMetadataAge, checkMetadataMaxAge)
	fetchMaxWaitLintRule      = fieldlint.Duration(kfiFieldFetchMaxWait, checkFetchMaxWait)
	consumerGroupLintRule     = fieldlint.String(checkConsumerGroup)
	outputMaxInFlightLintRule = fieldlint.Int(checkOutputMaxInFlight)

	outputMaxMessageBytesLintRule = fieldlint.String(func(s string) error {
		n, err := byteSize(kfoFieldMaxMessageBytes, s, maxBrokerIO, "between 1B and 1GiB, the largest request or response franz-go handles")
		if err != nil {
			return err
		}
		return checkRecordBatchBytes(int64(n))
	})
)

// compressionLintRule: Benthos's enum lint ignores case; start-up does not.
func compressionLintRule(codecs []string) string {
	return fieldlint.Exact(codecs, unknownCodec)
}

func checkPositive(field string) func(time.Duration) error {
	return fieldlint.Range(1, fieldlint.MaxDuration, "field "+field+": must be positive, got %v")
}

func checkGroupTimeout(field string) func(time.Duration) error {
	return fieldlint.Range(minGroupTimeout, maxWireDuration,
		fmt.Sprintf("field %s: %%s is not from %s to %s, what franz-go accepts (a 32-bit count of milliseconds)", field, minGroupTimeout, maxWireDuration))
}

var (
	checkMetadataMaxAge = fieldlint.Range(minMetadataMaxAge, maxMetadataMaxAge,
		fmt.Sprintf("field %s: %%s is not from %s to %s", kfFieldMetadataAge, minMetadataMaxAge, maxMetadataMaxAge))
	checkOutputMaxInFlight = fieldlint.Range(1, pluginconf.MaxInFlight,
		fmt.Sprintf("field %s: must be from 1 to %d, got %%d: Benthos starts a goroutine for each", kfoFieldMaxInFlight, pluginconf.MaxInFlight))
)

func checkFetchMaxWait(d time.Duration) error {
	if d < 10*time.Millisecond {
		return fmt.Errorf("field %s: %s is below 10ms, the least franz-go accepts", kfiFieldFetchMaxWait, d)
	}
	if d > maxWireDuration {
		return fmt.Errorf("field %s: %s is above %s, the most a fetch request can carry (a 32-bit count of milliseconds)", kfiFieldFetchMaxWait, d, maxWireDuration)
	}
	return nil
}

func checkAutoReplayNacks(replay bool) error {
	if !replay {
		return fmt.Errorf("field %s: false would drop rejected messages; kafka_franz always delivers them again, so remove the field or set it to true", kfiFieldAutoReplayNacks)
	}
	return nil
}

func checkConsumerGroup(s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("field %s: a consumer group is required: offsets are committed to it", kfiFieldConsumerGroup)
	}
	return nil
}

func checkRecordBatchBytes(n int64) error {
	if n < minRecordBatchBytes {
		return fmt.Errorf("field %s: %dB is below %dB, the smallest record batch franz-go builds", kfoFieldMaxMessageBytes, n, minRecordBatchBytes)
	}
	return nil
}

func unknownCodec(s string) error {
	return fmt.Errorf("field %s: unknown codec %q", kfoFieldCompression, s)
}

// checkHeartbeat checks heartbeat_interval against session_timeout.
func checkHeartbeat(heartbeat, session time.Duration) error {
	if heartbeat <= 0 || heartbeat >= session {
		return fmt.Errorf("field %s: %s must be positive and lower than %s (%s)", kfiFieldHeartbeatInterval, heartbeat, kfiFieldSessionTimeout, session)
	}
	return nil
}

// saslLintRule checks each mechanism as parseSASL does: Benthos's enum lint
// ignores case, start-up does not. Only the list is checked (the rule also
// runs on each entry), so that the entry's index can be named.
var saslLintRule = fieldlint.Rule(func(v any) []string {
	list, _ := v.([]any)
	var lints []string
	for i, e := range list {
		entry, _ := e.(map[string]any)
		mech, _ := entry[kfFieldSASLMech].(string)
		if mech == "" || mech == "none" || saslMechanisms[mech] != nil {
			continue
		}
		if strings.EqualFold(mech, "none") || saslMechanism(mech) {
			lints = append(lints, fmt.Sprintf("field %s[%d].%s: unsupported mechanism %q (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", kfFieldSASL, i, kfFieldSASLMech, mech))
		}
	}
	return lints
})

// saslMechanism says whether s is a mechanism in another case; other
// values are left to the enum lint.
func saslMechanism(s string) bool {
	for m := range saslMechanisms {
		if strings.EqualFold(s, m) {
			return true
		}
	}
	return false
}

// heartbeatLintRule is the input's rule for heartbeat_interval below
// session_timeout (defaults filled in). Durations that do not parse, or a
// session_timeout out of its range, are reported by their fields' rules.
var heartbeatLintRule = fieldlint.Rule(func(v any) []string {
	m, _ := v.(map[string]any)
	heartbeat, ok1, err1 := fieldlint.ParseDuration(kfiFieldHeartbeatInterval, m[kfiFieldHeartbeatInterval])
	session, ok2, err2 := fieldlint.ParseDuration(kfiFieldSessionTimeout, m[kfiFieldSessionTimeout])
	if !ok1 || !ok2 || err1 != nil || err2 != nil || session < minGroupTimeout || session > maxWireDuration {
		return nil
	}
	if err := checkHeartbeat(heartbeat, session); err != nil {
		return []string{err.Error()}
	}
	return nil
})
