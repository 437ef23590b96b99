package outboxcli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"

	"github.com/forwarder/forwarder/internal/dispatch"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// outboxComponents are the config keys whose `dsn` field names an outbox
// database (the prometheus exporter's `outbox` block included).
var outboxComponents = map[string]bool{
	"outbox": true, "outbox_retry": true, "outbox_dead_letter": true, "http_forwarder": true,
}

// CheckSchemaOnStart refuses to start the service against a database whose
// schema is newer than this binary: components would otherwise retry their
// connections forever with the same error. It runs once the config is parsed
// (service.CLIOptOnConfigParse), before any component starts. An unreachable
// database is not an error here: the components wait for it and migrate it
// when it comes.
func CheckSchemaOnStart(pConf *service.ParsedConfig) error {
	root, err := pConf.FieldAny()
	if err != nil {
		return nil
	}
	dsns := map[string]struct{}{}
	collectDSNs(root, dsns)
	for dsn := range dsns {
		if err := checkSchema(dsn); err != nil {
			return err
		}
	}
	return nil
}

func checkSchema(dsn string) error {
	pcfg, err := outboxdb.ParsePoolConfig(dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: "forwarder-startup"})
	if err != nil {
		return nil // the component reports a bad DSN with its field name
	}
	where := outboxdb.Redact(pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Database)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := outboxdb.Open(ctx, dsn, outboxdb.PoolConfig{MaxConns: 1, ApplicationName: "forwarder-startup"})
	if err != nil {
		return nil
	}
	defer pool.Close()
	v, err := outboxdb.SchemaVersion(ctx, pool)
	if err != nil {
		return nil
	}
	if latest := outboxdb.LatestVersion(); v > latest {
		return fmt.Errorf("database %s: %w: it is at version %d, this binary knows up to %d; upgrade the forwarder", where, outboxdb.ErrSchemaTooNew, v, latest)
	}
	return nil
}

// componentDSN is the connection string of a component config: its dsn, else
// the environment variable its dsn_env names (DATABASE_URL by default), else
// the default, as the components themselves resolve it.
func componentDSN(conf map[string]any) string {
	if dsn, ok := conf[dispatch.FieldDSN].(string); ok && dsn != "" {
		return dsn
	}
	name, ok := conf[dispatch.FieldDSNEnv].(string)
	if !ok || name == "" {
		name = dispatch.DefaultDSNEnv
	}
	if v := os.Getenv(name); v != "" {
		return v
	}
	return dispatch.DefaultDSN
}

// collectDSNs finds the dsn of every outbox component in a parsed config tree.
// Component configs are kept as YAML nodes (environment already
// interpolated), so they are decoded on the way.
func collectDSNs(node any, into map[string]struct{}) {
	switch n := node.(type) {
	case *yaml.Node:
		var v any
		if err := n.Decode(&v); err == nil {
			collectDSNs(v, into)
		}
	case map[string]any:
		for k, v := range n {
			if outboxComponents[k] {
				if m, ok := v.(map[string]any); ok {
					into[componentDSN(m)] = struct{}{}
				}
			}
			collectDSNs(v, into)
		}
	case []any:
		for _, v := range n {
			collectDSNs(v, into)
		}
	}
}
