// Package envsecret reads credentials that components take from the
// environment.
//
// Benthos substitutes ${VAR} into the YAML text before parsing it, so a
// secret pasted into a config that way is parsed as YAML: `#` starts a
// comment, `*` an alias, `!` a tag, `: ` a mapping. A component that needs a
// secret therefore has two fields: the value itself (optional, for tests and
// configs that really want it inline) and the name of an environment
// variable read as is, so any byte string works.
package envsecret

import (
	"os"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Fields returns the pair of config fields for one secret: field, the value
// (secret, optional), and field+"_env", the variable holding it (defaultEnv
// by default).
func Fields(field, valueDoc, defaultEnv string) []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(field).
			Description(valueDoc + " Leave it unset to read it from the environment variable named by `" + field + "_env`: a value pasted into the config by `${...}` interpolation is parsed as YAML, which breaks or silently cuts values holding characters such as `#`, `*`, `!` or `: `. Never logged.").
			Secret().
			Optional(),
		service.NewStringField(field + "_env").
			Description("The environment variable holding `" + field + "`, read as is (any character works) when `" + field + "` is not set.").
			Default(defaultEnv).
			Advanced(),
	}
}

// Read returns a secret: the field when set and not empty, else the
// environment variable named by field+"_env". source says where the value
// came from (or would have: the variable's name when both are empty), for
// error messages that must never show the value.
func Read(conf *service.ParsedConfig, field string) (value, source string, err error) {
	if conf.Contains(field) {
		v, err := conf.FieldString(field)
		if err != nil {
			return "", "", err
		}
		if v != "" {
			return v, "field " + field, nil
		}
	}
	name, err := conf.FieldString(field + "_env")
	if err != nil {
		return "", "", err
	}
	return os.Getenv(name), name, nil
}
