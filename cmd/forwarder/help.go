package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// usage and description replace stock Benthos's ("A stream processor for
// mundane tasks") in `forwarder --help`. Benthos builds its CLI app itself
// and offers no option for the two, so they are written into urfave/cli's
// app help template, which the app uses.
const (
	usage       = "moves parking-camera events from Kafka to the parking platform through a PostgreSQL outbox"
	description = `The whole service runs from one config, from the directory that holds mappings/:

     forwarder -c pipelines/forwarder.yaml [--set path=value]...

   Settings come from the environment (docs/configuration.md); --set changes
   one field of the config (SERVICE OPTIONS below). Also:

     forwarder lint ./pipelines/...                  check configs and the variables they use
     forwarder test ./pipelines/... ./mappings/...   run the configs' unit tests
     forwarder outbox stats                          rows by status and failure reasons (outbox --help for more)
     forwarder list                                  the components of this build

   It is a Benthos distribution: the commands below are Benthos's, with our plugins.`
)

// runOptions lists the flags of the service itself (`forwarder -c ...`,
// the default command, as `forwarder run`): -c, --set, -r, ... Benthos
// declares them on the app but hidden, so `forwarder --help` never showed
// them; --help-autocomplete is for shells, not people.
const runOptions = `

SERVICE OPTIONS (forwarder [options], or forwarder run [options] [CONFIG]):{{range .Flags}}{{if and (not .IsVisible) (ne (index .Names 0) "help-autocomplete")}}
   {{.}}{{end}}{{end}}`

func setHelp() {
	t := cli.AppHelpTemplate
	t = strings.Replace(t, `{{template "helpNameTemplate" .}}`, `{{.HelpName}} - `+usage, 1)
	t = strings.Replace(t, `{{if .Description}}

DESCRIPTION:
   {{template "descriptionTemplate" .}}{{end}}`, `

DESCRIPTION:
   `+description, 1)
	t = strings.Replace(t, `GLOBAL OPTIONS:{{template "visibleFlagTemplate" .}}{{end}}`,
		`GLOBAL OPTIONS:{{template "visibleFlagTemplate" .}}{{end}}`+runOptions, 1)
	cli.AppHelpTemplate = t
}
