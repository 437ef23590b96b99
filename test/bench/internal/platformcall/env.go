package platformcall

import (
	"fmt"
	"os"
	"time"
)

// Env is the environment variable k, or def when it is unset or empty: the
// baselines read the forwarder's environment (docs/configuration.md) with
// the forwarder's defaults.
func Env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// MapperFromEnv returns the topics the forwarder consumes (vehicle events,
// then heartbeats) and the Mapper its environment describes: the vehicle
// topic, the platform account and PLATFORM_TZ.
func MapperFromEnv() (topics []string, mapper *Mapper, err error) {
	vehicle := Env("KAFKA_TOPIC_VEHICLE", "device-vehicle-event")
	topics = []string{vehicle, Env("KAFKA_TOPIC_HEARTBEAT", "device-heartbeat")}
	loc, err := time.LoadLocation(Env("PLATFORM_TZ", "Asia/Shanghai"))
	if err != nil {
		return nil, nil, fmt.Errorf("loading PLATFORM_TZ: %w", err)
	}
	return topics, NewMapper(vehicle, os.Getenv("PLATFORM_ACCESS_NAME"), os.Getenv("PLATFORM_ACCESS_PWD"), loc), nil
}
