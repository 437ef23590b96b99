// Command chartsync copies the repository files the Helm chart ships
// (alert rules, Grafana dashboard, pipeline, mappings) into
// deploy/helm/forwarder/files. `make chart-sync` runs it; deploy/validate's
// tests fail while a copy is stale.
//
//	go run ./cmd/chartsync -root ../..
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/forwarder/forwarder/deploy/validate/chartfiles"
)

func main() {
	root := flag.String("root", "../..", "the repository root")
	flag.Parse()
	changed, err := chartfiles.Sync(*root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chartsync: %v\n", err)
		os.Exit(1)
	}
	if len(changed) == 0 {
		fmt.Println("chartsync: the chart's files are up to date")
	}
	for _, c := range changed {
		fmt.Println("chartsync: updated", c)
	}
}
