package validate

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

// loadCompose loads deploy/compose/compose.yaml as `docker compose` would:
// schema validation on (an unknown key fails), interpolation with an empty
// environment, paths resolved against the file's directory.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "compose")
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	})
	if err != nil {
		t.Fatalf("deploy/compose/compose.yaml: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// TestCompose: the compose stack is the image wired to a Kafka-compatible
// broker, PostgreSQL 15, the mock platform and generator, Prometheus with
// the alert rules and Grafana with the dashboard, and each piece points at
// the others where they listen.
func TestCompose(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	root := repoRoot(t)
	df := parseDockerfile(t)

	names := p.ServiceNames()
	sort.Strings(names)
	if want := []string{"devstack", "forwarder", "grafana", "postgres", "prometheus", "redpanda"}; !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}

	// The forwarder: the repository's image, as the chart runs it.
	fwd := service(t, p, "forwarder")
	if fwd.Build == nil || fwd.Build.Context != root || fwd.Build.Dockerfile != "Dockerfile" || fwd.Build.Target != "" {
		t.Errorf("forwarder build %+v, want the repository's Dockerfile, last stage", fwd.Build)
	}
	if fwd.HealthCheck == nil || !slices.Equal([]string(fwd.HealthCheck.Test), df.final.healthcheck) {
		t.Errorf("forwarder healthcheck %v, want the image's %v", fwd.HealthCheck, df.final.healthcheck)
	}
	if !fwd.ReadOnly || !slices.Contains([]string(fwd.Tmpfs), "/tmp") {
		t.Errorf("forwarder read_only %v tmpfs %v: want a read-only root with /tmp writable, as in the chart", fwd.ReadOnly, fwd.Tmpfs)
	}
	shutdown := pipelineDefault(t, "SHUTDOWN_TIMEOUT")
	if v := env(fwd, "SHUTDOWN_TIMEOUT"); v != "" {
		shutdown = v
	}
	sd, err := time.ParseDuration(shutdown)
	if err != nil {
		t.Fatal(err)
	}
	if fwd.StopGracePeriod == nil || time.Duration(*fwd.StopGracePeriod) <= sd {
		t.Errorf("forwarder stop_grace_period %v, want more than SHUTDOWN_TIMEOUT %v", fwd.StopGracePeriod, sd)
	}
	if !publishes(fwd, 4195) {
		t.Errorf("the forwarder's port 4195 (/metrics) is not published: %+v", fwd.Ports)
	}

	// Kafka: what the forwarder and the generator use is the broker's
	// advertised internal listener.
	rp := service(t, p, "redpanda")
	if !strings.HasPrefix(rp.Image, "docker.redpanda.com/redpandadata/redpanda:v") {
		t.Errorf("broker image %q, want a pinned Redpanda", rp.Image)
	}
	brokers := env(fwd, "KAFKA_BROKERS")
	if !strings.Contains(strings.Join(rp.Command, " "), "internal://"+brokers) {
		t.Errorf("KAFKA_BROKERS %q is not what redpanda advertises: %q", brokers, rp.Command)
	}

	// PostgreSQL 15, reached with the credentials it was created with.
	pg := service(t, p, "postgres")
	if pg.Image != "postgres:15" {
		t.Errorf("postgres image %q", pg.Image)
	}
	dbURL, err := url.Parse(env(fwd, "DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	pwd, _ := dbURL.User.Password()
	if dbURL.Hostname() != "postgres" || dbURL.User.Username() != env(pg, "POSTGRES_USER") ||
		pwd != env(pg, "POSTGRES_PASSWORD") || strings.TrimPrefix(dbURL.Path, "/") != env(pg, "POSTGRES_DB") {
		t.Errorf("DATABASE_URL %s does not match the postgres service's user, password and database", dbURL.Redacted())
	}

	// The mock platform and the generator: devstack's external mode,
	// against the same Kafka and database, accepting the forwarder's
	// credentials where PLATFORM_URL points.
	dev := service(t, p, "devstack")
	if dev.Build == nil || dev.Build.Context != root || dev.Build.Target != "devstack" {
		t.Errorf("devstack build %+v, want the Dockerfile's devstack stage", dev.Build)
	}
	args := flagValues(dev.Command)
	if args["-kafka-brokers"] != brokers {
		t.Errorf("devstack -kafka-brokers %q, the forwarder's KAFKA_BROKERS %q", args["-kafka-brokers"], brokers)
	}
	if env(dev, "DATABASE_URL") != env(fwd, "DATABASE_URL") {
		t.Error("devstack and the forwarder use different databases")
	}
	for _, v := range []string{"PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD"} {
		if env(dev, v) == "" || env(dev, v) != env(fwd, v) {
			t.Errorf("%s: devstack %q, forwarder %q; the mock platform must accept the forwarder's", v, env(dev, v), env(fwd, v))
		}
	}
	_, port, err := net.SplitHostPort(args["-platform-addr"])
	if err != nil {
		t.Fatalf("devstack -platform-addr: %v", err)
	}
	if want := "http://devstack:" + port; env(fwd, "PLATFORM_URL") != want {
		t.Errorf("PLATFORM_URL %q, want %q", env(fwd, "PLATFORM_URL"), want)
	}
	for _, dep := range []string{"postgres", "redpanda"} {
		for _, s := range []types.ServiceConfig{fwd, dev} {
			if s.DependsOn[dep].Condition != types.ServiceConditionHealthy {
				t.Errorf("%s starts before %s is healthy", s.Name, dep)
			}
		}
	}

	// Prometheus: the repository's alert rules where prometheus.yml loads
	// them, and the forwarder scraped as job="forwarder".
	prom := service(t, p, "prometheus")
	mounts := bindMounts(t, prom)
	alertsAt := mounts[filepath.Join(root, "deploy/prometheus/alerts.yml")]
	configAt := mounts[filepath.Join(root, "deploy/compose/prometheus.yml")]
	if alertsAt == "" || configAt != "/etc/prometheus/prometheus.yml" {
		t.Fatalf("prometheus mounts %v: want deploy/prometheus/alerts.yml and prometheus.yml at /etc/prometheus/prometheus.yml", mounts)
	}
	var promConf struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			MetricsPath   string `json:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(readRepo(t, "deploy/compose/prometheus.yml")), &promConf); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(promConf.RuleFiles, []string{alertsAt}) {
		t.Errorf("prometheus.yml loads rules %v, alerts.yml is mounted at %s", promConf.RuleFiles, alertsAt)
	}
	if len(promConf.ScrapeConfigs) != 1 || promConf.ScrapeConfigs[0].JobName != "forwarder" ||
		len(promConf.ScrapeConfigs[0].StaticConfigs) != 1 ||
		!slices.Equal(promConf.ScrapeConfigs[0].StaticConfigs[0].Targets, []string{"forwarder:4195"}) {
		t.Errorf("prometheus.yml scrapes %+v, want job forwarder at forwarder:4195 (the alert rules select job=\"forwarder\")", promConf.ScrapeConfigs)
	}

	// Grafana: the dashboard file where the provisioned provider reads,
	// and Prometheus as the default data source.
	gr := service(t, p, "grafana")
	gm := bindMounts(t, gr)
	dashAt := gm[filepath.Join(root, "deploy/grafana/forwarder-dashboard.json")]
	provAt := gm[filepath.Join(root, "deploy/compose/grafana/provisioning")]
	if dashAt == "" || provAt != "/etc/grafana/provisioning" {
		t.Fatalf("grafana mounts %v: want the dashboard and the provisioning directory", gm)
	}
	var provider struct {
		Providers []struct {
			Type    string `json:"type"`
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.Unmarshal([]byte(readRepo(t, "deploy/compose/grafana/provisioning/dashboards/forwarder.yaml")), &provider); err != nil {
		t.Fatal(err)
	}
	if len(provider.Providers) != 1 || provider.Providers[0].Type != "file" || filepath.Dir(dashAt) != provider.Providers[0].Options.Path {
		t.Errorf("the dashboard provider reads %+v, the dashboard is mounted at %s", provider.Providers, dashAt)
	}
	var ds struct {
		Datasources []struct {
			Type      string `json:"type"`
			URL       string `json:"url"`
			IsDefault bool   `json:"isDefault"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal([]byte(readRepo(t, "deploy/compose/grafana/provisioning/datasources/prometheus.yaml")), &ds); err != nil {
		t.Fatal(err)
	}
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("grafana data sources %+v, want the compose Prometheus as default", ds.Datasources)
	}
}

// bindMounts maps every bind mount's source to its target, failing for a
// source that does not exist.
func bindMounts(t *testing.T, s types.ServiceConfig) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if _, err := os.Stat(v.Source); err != nil {
			t.Errorf("%s mounts %s, which does not exist", s.Name, v.Source)
		}
		if !v.ReadOnly {
			t.Errorf("%s mounts %s writable", s.Name, v.Source)
		}
		out[v.Source] = v.Target
	}
	return out
}

func publishes(s types.ServiceConfig, port uint32) bool {
	for _, p := range s.Ports {
		if p.Target == port && p.Published != "" {
			return true
		}
	}
	return false
}

// flagValues reads "-name value" pairs of a command line.
func flagValues(cmd []string) map[string]string {
	out := map[string]string{}
	for i := 0; i+1 < len(cmd); i++ {
		if strings.HasPrefix(cmd[i], "-") {
			out[cmd[i]] = cmd[i+1]
			i++
		}
	}
	return out
}

// pipelineDefault is the default of ${name:default} in the shipped pipeline.
func pipelineDefault(t *testing.T, name string) string {
	t.Helper()
	m := regexp.MustCompile(`\$\{` + name + `:([^}]*)\}`).FindStringSubmatch(readRepo(t, "pipelines/forwarder.yaml"))
	if m == nil {
		t.Fatalf("pipelines/forwarder.yaml has no default for %s", name)
	}
	return m[1]
}
