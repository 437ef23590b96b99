// Package mapping provides the mapping_file processor, which runs a Bloblang
// mapping kept in a file and reloads it when the file changes. Compiling the
// file, the language it is written in (percent_round, ts_format_platform, no
// access to the host) and the reasons a failing mapping flags a message with
// live in internal/mappingfile, which the tools that preview mappings share.
package mapping

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/mappingfile"
	"github.com/forwarder/forwarder/internal/msgmeta"
	"github.com/forwarder/forwarder/internal/periodic"
	"github.com/forwarder/forwarder/plugins/internal/fieldlint"
)

const (
	mfFieldPath           = "path"
	mfFieldReloadInterval = "reload_interval"

	// metricReloads counts reloads after start by result: success or error.
	metricReloads = "forwarder_mapping_reloads_total"
)

var mappingFileSpec = sync.OnceValue(func() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Categories("Mapping").
		Summary("Executes a Bloblang mapping read from a file, and reloads it without a restart when the file changes.").
		Description(`
Works like the `+"`mapping`"+` processor (the result replaces the message, metadata is kept, a failing mapping leaves the message unchanged and flags it with the error) except that the mapping lives in a file which is watched while the stream runs.

The claim of a message handed out by `+"`outbox_retry`"+` survives the mapping: the metadata it set (`+"`outbox_id`"+`, `+"`claim_token`"+`, `+"`attempt`"+`, `+"`api_type`"+`, `+"`message_key`"+`, the `+"`kafka_*`"+` origin and the lease and creation times) comes back when the mapping removed it, so `+"`meta = deleted()`"+`, a common way to keep metadata out of a request, does not keep `+"`http_forwarder`"+` from recording the result or an `+"`@api_type`"+` interpolation from choosing the endpoint. A key the mapping set to another value keeps that value; other metadata stays deleted. Benthos's own `+"`mapping`"+` and `+"`bloblang`"+` processors have no such protection: there, a stripped claim makes the output nack the message, and its row ends `+"`FAILED`"+` once out of attempts, saying which key is missing.

Every `+"`reload_interval`"+` the processor checks the file and every file it imports (modification time and size, then content). When the content changed and stays the same for a short settle period, the new mapping is compiled and swapped in atomically. An edit that does not compile, or a file that disappears, is rejected: the error is logged with the file it is in (the imported file, when the mistake is in an import), its line and its column, the counter `+"`forwarder_mapping_reloads_total{result=\"error\"}`"+` goes up, and the previous mapping keeps serving until a later edit compiles. Each batch is mapped by one compiled mapping, taken once per batch, so no message is ever mapped half by the old and half by the new version. Prefer saving with an atomic rename (most editors do); a file written in place is still only read once it has settled.

The path, and the paths of `+"`import`"+` statements inside the file, follow Bloblang's rules: a relative path is resolved against the process's working directory (not the config file's directory), and an import is resolved against the directory of the file that contains it. `+"`forwarder lint`"+` compiles the file too, from the working directory it runs in.

A mapping file cannot read the host: it is compiled without Bloblang's functions that read the environment, files or the host (`+"`env`"+`, `+"`file`"+`, `+"`file_rel`"+`, `+"`hostname`"+`, and any other function or method Benthos marks impure, but for `+"`ts_format_platform`"+`, which reads `+"`PLATFORM_TZ`"+` only), and an `+"`import`"+` of a file outside the directory of the mapping file (or its subdirectories) is refused. Either is a compile error that says so, at start-up, in `+"`forwarder lint`"+` and on reload. The error a mapping raises ends up in the outbox row, the logs and the console, so a mapping that could call `+"`env(\"DATABASE_URL\")`"+` could put a secret there.

When the mapping fails for a message, the flag carries the reason without Bloblang's structural prefixes (`+"`failed assignment (line N): `"+`, `+"`failed to process element N: `"+`, ...), so `+"`throw(\"inoutType 7 is not 0 or 1\")`"+` flags the message with exactly `+"`inoutType 7 is not 0 or 1`"+`; the full error is logged at debug level. Every value the reason quotes (the value a type error got, the text `+"`strconv`"+` could not parse) is cut to 64 bytes, and the whole reason to 1 KiB, each with a note of how many bytes were left out.

== Metrics

- `+"`forwarder_mapping_reloads_total`"+` (counter, label `+"`result`"+`: `+"`success`"+` or `+"`error`"+`): reloads attempted after start.`).
		Fields(
			service.NewStringField(mfFieldPath).
				Description("The Bloblang file to execute. Relative paths are resolved against the working directory of the process.").
				Example("mappings/vehicle_event.blobl").
				LintRule(`root = `+mappingfile.LintFunction+`(this)`),
			service.NewDurationField(mfFieldReloadInterval).
				Description("How often the file (and its imports) is checked for changes. `0s` disables reloading.").
				Default("2s").
				LintRule(fieldlint.Duration(mfFieldReloadInterval, checkReloadInterval)),
		).
		Example("Per API type", "Maps each message with the file for its API type; editing either file takes effect within a few seconds.", `
pipeline:
  processors:
    - switch:
        - check: '@api_type == "VEHICLE_EVENT"'
          processors:
            - label: map_vehicle_event
              mapping_file:
                path: mappings/vehicle_event.blobl
                reload_interval: 2s
        - check: '@api_type == "HEARTBEAT"'
          processors:
            - label: map_heartbeat
              mapping_file:
                path: mappings/heartbeat.blobl
`)
})

func init() {
	service.MustRegisterBatchProcessor("mapping_file", mappingFileSpec(),
		func(conf *service.ParsedConfig, res *service.Resources) (service.BatchProcessor, error) {
			return newMappingFileFromParsed(conf, res)
		})
}

type mappingFileProc struct {
	path    string
	settle  time.Duration
	files   mappingfile.FileReader
	log     *service.Logger
	reloads *service.MetricCounter

	current atomic.Pointer[mappingfile.Mapping]

	// watched is what the watch loop last saw of every file the last compile
	// attempt read; only the watch goroutine touches it after construction.
	watched mappingfile.Files

	// watch checks the files every interval; nil when reloading is off.
	watch *periodic.Loop
}

func newMappingFileFromParsed(conf *service.ParsedConfig, res *service.Resources) (*mappingFileProc, error) {
	path, err := conf.FieldString(mfFieldPath)
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("mapping_file: path is empty: set it to a .blobl file")
	}
	interval, err := conf.FieldDuration(mfFieldReloadInterval)
	if err != nil {
		return nil, err
	}
	if err := checkReloadInterval(interval); err != nil {
		return nil, err
	}
	return newMappingFile(path, interval, resourceFiles{res.FS()}, res.Logger(), res.Metrics())
}

func newMappingFile(path string, interval time.Duration, files mappingfile.FileReader, log *service.Logger, metrics *service.Metrics) (*mappingFileProc, error) {
	p := &mappingFileProc{
		path:    path,
		settle:  min(interval/2, 200*time.Millisecond),
		files:   files,
		log:     log,
		reloads: metrics.NewCounter(metricReloads, "result"),
	}
	// Both series exist from start, at 0, so that dashboards and alerts
	// on rejected reloads see a value before the first reload happens.
	for _, result := range []string{"success", "error"} {
		p.reloads.Incr(0, result)
	}
	m, watched, err := mappingfile.Compile(files, path)
	if err != nil {
		return nil, fmt.Errorf("mapping_file: %w", err)
	}
	p.current.Store(m)
	p.watched = watched
	if interval > 0 {
		p.watch = periodic.Start(context.Background(), periodic.Config{Interval: interval},
			func(ctx context.Context) { p.checkOnce(ctx) })
	}
	return p, nil
}

// ProcessBatch maps every message with the mapping current when the batch
// arrives.
func (p *mappingFileProc) ProcessBatch(_ context.Context, batch service.MessageBatch) ([]service.MessageBatch, error) {
	// Taken once: a reload during the batch applies from the next batch on.
	m := p.current.Load()
	exec := batch.BloblangExecutor(m.Exec)
	out := make(service.MessageBatch, 0, len(batch))
	for i, msg := range batch {
		res, err := exec.Query(i)
		if err != nil {
			p.log.Debugf("mapping %s failed: %s", p.path, mappingfile.LogReason(err))
			failed := msg.Copy()
			failed.SetError(errors.New(mappingfile.ErrorReason(err)))
			out = append(out, failed)
			continue
		}
		if res != nil {
			msgmeta.KeepClaim(msg, res)
			out = append(out, res)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []service.MessageBatch{out}, nil
}

// Close stops watching the file.
func (p *mappingFileProc) Close(ctx context.Context) error {
	return p.watch.StopWithin(ctx)
}

// checkOnce reloads the mapping when one of its files changed and settled.
// It reports whether a reload was attempted.
func (p *mappingFileProc) checkOnce(ctx context.Context) bool {
	if !p.watched.Changed(p.files) {
		return false
	}
	// A file written in place can be caught half-written, and a truncated
	// mapping may well compile: only take content that stayed the same for
	// the settle period.
	first := p.watched.Snapshot(p.files)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(p.settle):
	}
	if first.Changed(p.files) {
		return false // still being written: the next tick looks again
	}

	m, watched, err := mappingfile.Compile(p.files, p.path)
	p.watched = watched
	// The fields say the same for tools that follow the log (the dev
	// stack's screen shows reloads). The log line comes first, then the
	// counter, then the swap: whoever sees the counter move, or the new
	// mapping serve, finds the line already written.
	if err != nil {
		p.log.With("mapping_file", p.path, "mapping_reload", "rejected", "error", err.Error()).
			Errorf("Rejected the edit of mapping file %s, the previous mapping keeps serving: %v", p.path, err)
		p.reloads.Incr(1, "error")
		return true
	}
	sum := fmt.Sprintf("%x", m.Sum[:6])
	p.log.With("mapping_file", p.path, "mapping_reload", "success", "sha256", sum).
		Infof("Reloaded mapping file %s (sha256 %s)", p.path, sum)
	p.reloads.Incr(1, "success")
	p.current.Store(m)
	return true
}

// resourceFiles reads through the stream's FS, as every other component does.
type resourceFiles struct{ fs *service.FS }

func (r resourceFiles) Stat(name string) (fs.FileInfo, error) { return r.fs.Stat(name) }

func (r resourceFiles) ReadFile(name string) ([]byte, error) {
	f, err := r.fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// checkReloadInterval is the check of reload_interval, which start-up runs
// on the parsed value and lint (fieldlint) on the value written.
var checkReloadInterval = fieldlint.Range(0, fieldlint.MaxDuration, "mapping_file: reload_interval %v is negative: use 0s to disable reloading")
