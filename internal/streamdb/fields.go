package streamdb

import (
	"errors"
	"fmt"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/envsecret"
)

// DSN fields shared by every component that reads or writes the outbox.
const (
	FieldDSN          = "dsn"
	FieldDSNEnv       = "dsn_env"
	FieldDirectDSN    = "direct_dsn"
	FieldDirectDSNEnv = "direct_dsn_env"

	// DefaultDirectDSNEnv names the environment variable a component reads
	// its direct connection string from when direct_dsn is not set.
	DefaultDirectDSNEnv = "DATABASE_DIRECT_URL"

	// DefaultDSNEnv names the environment variable a component reads its
	// connection string from when dsn is not set.
	DefaultDSNEnv = "DATABASE_URL"
	// DefaultDSN is used when neither dsn nor the variable is set.
	DefaultDSN = "postgres://localhost:5432/forwarder"
)

// DSNFields are the config fields naming the outbox database.
func DSNFields() []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(FieldDSN).
			Description("PostgreSQL connection string (libpq URL or key=value). Leave it unset to read it from the environment variable named by `dsn_env`: a value pasted into the config by `${...}` interpolation is parsed as YAML, which breaks or silently cuts passwords holding characters such as `#`, `*`, `!` or `: `. Never logged. Set `pool_max_conns` in it to change the size of the pool the stream's outbox components share (default 8).").
			Example("postgres://forwarder@db:5432/forwarder?sslmode=verify-full").
			Secret().
			Optional(),
		service.NewStringField(FieldDSNEnv).
			Description("The environment variable holding the connection string, read as is (any character works) when `dsn` is not set. When the variable is unset too, `" + DefaultDSN + "`.").
			Default(DefaultDSNEnv).
			Advanced(),
		service.NewStringField(FieldDirectDSN).
			Description("A direct connection to the same database, for what needs a session of its own (LISTEN, migrations, the retention lock), when `dsn` leads to a transaction-pooling PgBouncer. Setting it says that `dsn` is pooled: statements are then sent without server-side prepared statements. Leave it unset to read it from the environment variable named by `direct_dsn_env`; when that is unset too, `dsn` is taken to lead to PostgreSQL itself, and start-up refuses a `dsn` whose sessions do not survive between transactions. Never logged.").
			Example("postgres://forwarder@db:5432/forwarder?sslmode=verify-full").
			Secret().
			Optional().
			Advanced(),
		service.NewStringField(FieldDirectDSNEnv).
			Description("The environment variable holding `direct_dsn`, read as is when `direct_dsn` is not set.").
			Default(DefaultDirectDSNEnv).
			Advanced(),
	}
}

// DSNFromParsed returns the connection string a component's config names:
// dsn when set, else the environment variable named by dsn_env, else
// DefaultDSN.
func DSNFromParsed(conf *service.ParsedConfig) (string, error) {
	dsn, _, err := envsecret.Read(conf, FieldDSN)
	if err != nil || dsn != "" {
		return dsn, err
	}
	return DefaultDSN, nil
}

// DirectDSNFromParsed returns the direct connection string a component's
// config names (direct_dsn, else the variable named by direct_dsn_env), ""
// when there is none.
func DirectDSNFromParsed(conf *service.ParsedConfig) (string, error) {
	dsn, _, err := envsecret.Read(conf, FieldDirectDSN)
	return dsn, err
}

// DSNSource names where a component's connection string comes from, for
// error messages (never the value).
func DSNSource(conf *service.ParsedConfig) string {
	_, source, _ := envsecret.Read(conf, FieldDSN)
	return source
}

// FromParsed returns the DB of the database a component's config names.
// A connection string that does not parse is reported by where it comes
// from (DATABASE_URL, or the dsn field), never by value.
func FromParsed(conf *service.ParsedConfig, res *service.Resources) (*DB, error) {
	dsn, err := DSNFromParsed(conf)
	if err != nil {
		return nil, err
	}
	direct, err := DirectDSNFromParsed(conf)
	if err != nil {
		return nil, err
	}
	h, err := WithDirect(res, dsn, direct)
	var derr directDSNError
	if errors.As(err, &derr) {
		_, source, _ := envsecret.Read(conf, FieldDirectDSN)
		return nil, fmt.Errorf("%s: %w", source, derr.err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", DSNSource(conf), err)
	}
	return h, nil
}
