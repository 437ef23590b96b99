// Package validate checks the deployment files without Docker or a
// cluster: the Helm chart in deploy/helm/forwarder renders with Helm's own
// engine and every object decodes strictly into its Kubernetes (or
// Prometheus Operator) API type; the Dockerfile parses with BuildKit's
// parser and agrees with the chart; deploy/compose/compose.yaml loads with
// compose-go and is wired consistently; the chart's copies of repository
// files are current (make chart-sync).
//
// It is a module of its own so that Helm, the Kubernetes API types,
// BuildKit and compose-go stay out of the product's go.mod. `make test`
// runs it: cd deploy/validate && go test ./...
package validate
