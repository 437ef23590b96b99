package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	fullname = "forwarder" // release "forwarder" of chart "forwarder"
	// The paths the image and the chart agree on (Dockerfile).
	pipelinesDir = "/etc/forwarder/pipelines"
	mappingsDir  = "/etc/forwarder/mappings"
	imageUID     = 65532
)

// secretVars reach the container only from the Secret.
var secretVars = []string{"DATABASE_URL", "PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD", "KAFKA_SASL_PASSWORD", "CONSOLE_TOKEN"}

// optionalSecrets may be missing from the Secret.
var optionalSecrets = map[string]bool{"KAFKA_SASL_PASSWORD": true, "CONSOLE_TOKEN": true}

// contractVars is the environment of pipelines/forwarder.yaml that
// docs/configuration.md documents, plus the service's extras: the chart
// sets every one (from values or from the Secret).
var contractVars = []string{
	"KAFKA_BROKERS", "KAFKA_GROUP", "KAFKA_TOPIC_VEHICLE", "KAFKA_TOPIC_HEARTBEAT",
	"KAFKA_TLS", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_PASSWORD", "KAFKA_BATCH_PERIOD",
	"DATABASE_URL", "PLATFORM_URL", "PLATFORM_ACCESS_NAME", "PLATFORM_ACCESS_PWD", "PLATFORM_TZ",
	"HTTP_ADDR", "FORWARD_MAX_IN_FLIGHT", "FORWARD_TIMEOUT", "FORWARD_MAX_ATTEMPTS",
	"FORWARD_RETRY_INITIAL", "FORWARD_RETRY_MAX", "CLAIM_LEASE", "PLATFORM_PROBE_INTERVAL",
	"FORWARD_RATE_LIMIT", "FAILED_REQUEUE_AFTER", "FAILED_REQUEUE_ROUNDS", "ORDERING",
	"ORDER_ON_FAILED", "CONSOLE_ADDR", "CONSOLE_TOKEN",
	"OUTBOX_BATCH_SIZE", "OUTBOX_MAX_UNACKED", "OUTBOX_MAX_UNACKED_DIRECT", "OUTBOX_PARTITION", "OUTBOX_RETENTION", "OUTBOX_RETENTION_FORCE",
	"OUTBOX_RETENTION_DEAD_LETTER", "LOG_LEVEL", "SHUTDOWN_TIMEOUT",
	"TRACE_SAMPLE_RATIO",
}

// TestChartDefaultValues renders the chart as `helm install` with no
// values would, and checks what a deployment relies on.
func TestChartDefaultValues(t *testing.T) {
	t.Parallel()
	r := render(t, nil)

	var kinds []string
	for _, o := range r.objects {
		kinds = append(kinds, o.kind+"/"+o.name)
	}
	want := []string{
		"ConfigMap/forwarder-mappings", "ConfigMap/forwarder-pipelines", "Deployment/forwarder",
		"Job/forwarder-migrate", "PodDisruptionBudget/forwarder", "Secret/forwarder-credentials",
		"Service/forwarder", "ServiceAccount/forwarder",
	}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("rendered %q, want %q (monitoring objects are off by default)", kinds, want)
	}

	d := one[*appsv1.Deployment](t, r, "Deployment")
	// docs/deployment.md (Sizing) recommends three instances: the default.
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 || !strings.Contains(readRepo(t, "docs/deployment.md"), "Three instances on a topic of three") {
		t.Errorf("replicas %v; want the three instances docs/deployment.md recommends", d.Spec.Replicas)
	}
	c := container(t, d.Spec.Template.Spec, "forwarder")
	checkPod(t, d.Spec.Template.Spec, c)
	checkProbesAndPorts(t, c)
	checkConfigVolumes(t, d)
	checkGracePeriod(t, d, c)
	checkSecretRefs(t, c, "forwarder-credentials", nil)
	checkEnvCoversPipeline(t, c)
	if c.Image != "forwarder:0.1.0" {
		t.Errorf("image %q, want the chart's appVersion as tag", c.Image)
	}
	if got := d.Spec.Template.Annotations["checksum/secret"]; got == "" {
		t.Error("no checksum/secret annotation: a changed chart-made Secret would not roll the pods")
	}

	// The Secret: created as a hook before the migration Job needs it, and
	// with no empty keys (an unset credential fails the pod by its key).
	s := named[*corev1.Secret](t, r, "Secret", "forwarder-credentials")
	job := one[*batchv1.Job](t, r, "Job")
	if !isHook(r, "Secret", s.Name) || hookWeight(t, s.Annotations) >= hookWeight(t, job.Annotations) {
		t.Errorf("the chart's Secret must be a pre-install hook weighted before the migration Job: %v vs %v", s.Annotations, job.Annotations)
	}
	if len(s.StringData) != 0 {
		t.Errorf("with no credentials given the Secret holds %v, want nothing", s.StringData)
	}
	checkMigrationJob(t, r, job, "DATABASE_URL", "forwarder-credentials", "DATABASE_URL")
	checkServiceAndPDB(t, r, d)
	checkConfigMapsShipRepoFiles(t, r)

	if !strings.Contains(r.notes, "secret.values.DATABASE_URL is empty") {
		t.Errorf("NOTES do not warn about the missing credentials:\n%s", r.notes)
	}
}

// TestChartProductionValues renders ci/production-values.yaml: an existing
// Secret with its own key names, three replicas, the Prometheus Operator
// objects and the Grafana dashboard.
func TestChartProductionValues(t *testing.T) {
	t.Parallel()
	vals := valuesFile(t, "ci/production-values.yaml")
	r := render(t, vals)

	if got := r.all("Secret"); len(got) != 0 {
		t.Errorf("with secret.existingSecret the chart rendered a Secret: %s", got[0].name)
	}
	d := one[*appsv1.Deployment](t, r, "Deployment")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", d.Spec.Replicas)
	}
	c := container(t, d.Spec.Template.Spec, "forwarder")
	checkPod(t, d.Spec.Template.Spec, c)
	checkProbesAndPorts(t, c)
	checkConfigVolumes(t, d)
	checkGracePeriod(t, d, c)
	checkEnvCoversPipeline(t, c)
	checkSecretRefs(t, c, "forwarder-credentials", map[string]string{
		"DATABASE_URL": "database-url", "PLATFORM_ACCESS_NAME": "platform-access-name",
		"PLATFORM_ACCESS_PWD": "platform-access-pwd", "CONSOLE_TOKEN": "console-token",
	})
	// Least privilege: the service's pods get the console's own URL, from
	// a Secret of its own, and never the schema owner's.
	if ref := secretRef(c, "CONSOLE_DATABASE_URL"); ref == nil || ref.Name != "forwarder-db-console" || ref.Key != "database-url" {
		t.Errorf("CONSOLE_DATABASE_URL from %+v, want Secret forwarder-db-console key database-url", ref)
	}
	if ref := secretRef(c, "DATABASE_MIGRATE_URL"); ref != nil {
		t.Errorf("the service gets the schema owner's DATABASE_MIGRATE_URL (%+v)", ref)
	}
	if _, ok := d.Spec.Template.Annotations["checksum/secret"]; ok {
		t.Error("checksum/secret on an existing Secret the chart cannot read")
	}
	if c.Image != "registry.example.com/parking/forwarder:1.4.2" {
		t.Errorf("image %q", c.Image)
	}
	checkMemory(t, c, "1536Mi", "1075MiB")
	if got := c.Resources.Requests.Cpu().String(); got != "1" {
		t.Errorf("cpu request %s, want 1", got)
	}
	if c.Env[len(c.Env)-1].Name != "POD_NAME" || c.Env[len(c.Env)-1].ValueFrom == nil {
		t.Errorf("extraEnv not appended as EnvVar: %+v", c.Env[len(c.Env)-1])
	}
	checkMigrationJob(t, r, one[*batchv1.Job](t, r, "Job"), "DATABASE_MIGRATE_URL", "forwarder-db-owner", "database-url")
	checkServiceAndPDB(t, r, d)
	var ca bool
	for _, m := range c.VolumeMounts {
		ca = ca || (m.Name == "postgres-ca" && m.MountPath == "/etc/forwarder/tls")
	}
	if !ca || d.Spec.Template.Spec.Volumes[len(d.Spec.Template.Spec.Volumes)-1].Secret == nil {
		t.Errorf("extraVolumes/extraVolumeMounts not applied: mounts %+v", c.VolumeMounts)
	}
	// The migration reads the same DATABASE_URL, so it needs the same CA.
	jobSpec := one[*batchv1.Job](t, r, "Job").Spec.Template.Spec
	if !reflect.DeepEqual(jobSpec.Volumes, d.Spec.Template.Spec.Volumes[len(d.Spec.Template.Spec.Volumes)-1:]) ||
		!reflect.DeepEqual(container(t, jobSpec, "migrate").VolumeMounts, c.VolumeMounts[len(c.VolumeMounts)-1:]) {
		t.Errorf("the migration Job lacks the extra volumes: %+v", jobSpec.Volumes)
	}

	// Prometheus Operator: the ServiceMonitor scrapes the Service's http
	// port as job="forwarder"; the rules are deploy/prometheus/alerts.yml.
	svc := one[*corev1.Service](t, r, "Service")
	sm := one[*monitoringv1.ServiceMonitor](t, r, "ServiceMonitor")
	if !matches(sm.Spec.Selector.MatchLabels, svc.Labels) {
		t.Errorf("the ServiceMonitor selects %v, the Service has %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if job := svc.Labels[sm.Spec.JobLabel]; job != "forwarder" {
		t.Errorf("the scrape job is the Service's %q label, %q; the alert rules select job=\"forwarder\"", sm.Spec.JobLabel, job)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want port http, path /metrics", sm.Spec.Endpoints)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("serviceMonitor.labels not applied: %v", sm.Labels)
	}

	rule := one[*monitoringv1.PrometheusRule](t, r, "PrometheusRule")
	want := alertGroups(t)
	if !reflect.DeepEqual(rule.Spec.Groups, want) {
		got, _ := yaml.Marshal(rule.Spec.Groups)
		exp, _ := yaml.Marshal(want)
		t.Errorf("PrometheusRule groups differ from deploy/prometheus/alerts.yml:\ngot:\n%s\nwant:\n%s", got, exp)
	}
	if len(want) == 0 || len(want[0].Rules) == 0 {
		t.Fatal("deploy/prometheus/alerts.yml has no rules")
	}

	dash := named[*corev1.ConfigMap](t, r, "ConfigMap", "forwarder-dashboard")
	if dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard: \"1\" for Grafana's sidecar", dash.Labels)
	}
	src := readRepo(t, "deploy/grafana/forwarder-dashboard.json")
	if dash.Data["forwarder-dashboard.json"] != src {
		t.Error("the dashboard ConfigMap does not hold deploy/grafana/forwarder-dashboard.json as is")
	}
	if !json.Valid([]byte(dash.Data["forwarder-dashboard.json"])) {
		t.Error("the dashboard is not valid JSON")
	}
}

// TestChartMappingEditsDoNotRestart: a mapping change (helm upgrade with
// mappings:) changes only the mappings ConfigMap, never the pod template,
// so the pods keep running and reload it; a pipeline change rolls them.
func TestChartMappingEditsDoNotRestart(t *testing.T) {
	t.Parallel()
	base := render(t, nil)
	edited := render(t, map[string]any{"mappings": map[string]any{
		"vehicle_event.blobl": "root = this\n",
		"extra.blobl":         "root.x = 1\n",
	}})
	cm := named[*corev1.ConfigMap](t, edited, "ConfigMap", "forwarder-mappings")
	if cm.Data["vehicle_event.blobl"] != "root = this\n" || cm.Data["extra.blobl"] != "root.x = 1\n" {
		t.Fatalf("mappings: values not applied to the ConfigMap: %v", keys(cm.Data))
	}
	if cm.Data["heartbeat.blobl"] != readRepo(t, "mappings/heartbeat.blobl") {
		t.Error("overriding one mapping dropped or changed the others")
	}
	before := one[*appsv1.Deployment](t, base, "Deployment").Spec.Template
	after := one[*appsv1.Deployment](t, edited, "Deployment").Spec.Template
	if !reflect.DeepEqual(before, after) {
		t.Errorf("a mapping edit changed the pod template (the pods would restart):\nbefore %v\nafter  %v",
			before.Annotations, after.Annotations)
	}

	piped := render(t, map[string]any{"pipeline": "input:\n  stdin: {}\n"})
	if reflect.DeepEqual(before, one[*appsv1.Deployment](t, piped, "Deployment").Spec.Template) {
		t.Error("a pipeline edit left the pod template unchanged: the pods would keep the old pipeline")
	}
	if got := named[*corev1.ConfigMap](t, piped, "ConfigMap", "forwarder-pipelines").Data["forwarder.yaml"]; got != "input:\n  stdin: {}\n" {
		t.Errorf("pipeline: value not applied: %q", got)
	}
}

// TestChartExtraArgs: extraArgs follow the image's own arguments, one
// container argument each, so docs/configuration.md's advice (--set a
// field of the pipeline) can be given to the chart; a change rolls the
// pods. That the forwarder accepts the documented --set is checked in
// docs/docs_test.go.
func TestChartExtraArgs(t *testing.T) {
	t.Parallel()
	const set = "input.broker.inputs.0.kafka_franz.max_buffered_bytes=32MiB"
	if !strings.Contains(readRepo(t, "docs/configuration.md"), "  - --set\n  - "+set+"\n") {
		t.Fatalf("docs/configuration.md no longer shows extraArgs with --set %s: update this test", set)
	}
	base := render(t, nil)
	r := render(t, map[string]any{"extraArgs": []any{"--set", set}})
	c := container(t, one[*appsv1.Deployment](t, r, "Deployment").Spec.Template.Spec, "forwarder")
	want := append(slices.Clone(parseDockerfile(t).final.cmd), "--set", set)
	if !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	if reflect.DeepEqual(one[*appsv1.Deployment](t, base, "Deployment").Spec.Template, one[*appsv1.Deployment](t, r, "Deployment").Spec.Template) {
		t.Error("extraArgs left the pod template unchanged: the pods would keep their old arguments")
	}
}

// TestChartRefusesUnsafeValues: settings that would break a promise do not
// render, with a message naming the value to fix.
func TestChartRefusesUnsafeValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"GraceNotAboveShutdown", map[string]any{"shutdownTimeout": "45s", "terminationGracePeriodSeconds": 45}, "terminationGracePeriodSeconds (45) must exceed shutdownTimeout (45s)"},
		{"GraceBelowShutdownInMinutes", map[string]any{"shutdownTimeout": "2m"}, "must exceed shutdownTimeout (120s)"},
		{"UnparsableShutdown", map[string]any{"shutdownTimeout": "30 seconds"}, `shutdownTimeout "30 seconds"`},
		{"SecretInEnv", map[string]any{"env": map[string]any{"PLATFORM_ACCESS_PWD": "x"}}, "env.PLATFORM_ACCESS_PWD: put it in the Secret"},
		{"HTTPAddrInEnv", map[string]any{"env": map[string]any{"HTTP_ADDR": "0.0.0.0:8080"}}, "env.HTTP_ADDR is set by the chart"},
		{"GOMEMLIMITInEnv", map[string]any{"env": map[string]any{"GOMEMLIMIT": "900MiB"}}, "env.GOMEMLIMIT is set by the chart"},
		{"MemoryLimitInResources", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "256Mi"}}}, "resources: leave memory out and set memory"},
		{"MemoryRequestInResources", map[string]any{"resources": map[string]any{"requests": map[string]any{"memory": "256Mi"}}}, "resources: leave memory out and set memory"},
		{"MemoryNotInMiOrGi", map[string]any{"memory": "1GB"}, `memory "1GB": write it in Mi or Gi`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderChart(t, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestChartCreatedSecret: credentials given in values land in the chart's
// Secret under their keys, and only there.
func TestChartCreatedSecret(t *testing.T) {
	t.Parallel()
	const pwd = "p@ss: #{not yaml}"
	r := render(t, map[string]any{"secret": map[string]any{"values": map[string]any{
		"DATABASE_URL":         "postgres://forwarder:pw@db:5432/forwarder?sslmode=verify-full",
		"PLATFORM_ACCESS_NAME": "name",
		"PLATFORM_ACCESS_PWD":  pwd,
	}}})
	s := named[*corev1.Secret](t, r, "Secret", "forwarder-credentials")
	if s.StringData["PLATFORM_ACCESS_PWD"] != pwd || s.StringData["PLATFORM_ACCESS_NAME"] != "name" {
		t.Errorf("Secret stringData %v", keys(s.StringData))
	}
	if _, ok := s.StringData["CONSOLE_TOKEN"]; ok {
		t.Error("an empty CONSOLE_TOKEN was stored")
	}
	for _, o := range r.objects {
		if o.kind == "Secret" {
			continue
		}
		b, _ := yaml.Marshal(o.obj)
		if strings.Contains(string(b), pwd) {
			t.Errorf("the password appears in %s/%s", o.kind, o.name)
		}
	}
	if strings.Contains(r.notes, "WARNING") {
		t.Errorf("NOTES warn although the credentials are set:\n%s", r.notes)
	}
}

// TestChartLeastPrivilegeRoles: with database.migrationRole, directURL and
// consoleRole and the chart's own Secrets, the owner's URL is in a Secret of
// its own that only the migration Job reads, the console's in another, the
// service gets its URL and the direct one and never the owner's
// (docs/deployment.md, Roles and grants).
func TestChartLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	const owner = "postgres://forwarder_owner:OWNER-PW@pg:5432/forwarder"
	r := render(t, map[string]any{
		"database": map[string]any{"migrationRole": true, "directURL": true, "consoleRole": true},
		"secret": map[string]any{"values": map[string]any{
			"DATABASE_URL":         "postgres://forwarder_service:SVC-PW@pgbouncer:6432/forwarder",
			"DATABASE_DIRECT_URL":  "postgres://forwarder_service:SVC-PW@pg:5432/forwarder",
			"DATABASE_MIGRATE_URL": owner,
			"CONSOLE_DATABASE_URL": "postgres://forwarder_console:CON-PW@pgbouncer:6432/forwarder",
			"PLATFORM_ACCESS_NAME": "name", "PLATFORM_ACCESS_PWD": "pwd",
		}},
	})
	creds := named[*corev1.Secret](t, r, "Secret", "forwarder-credentials")
	migration := named[*corev1.Secret](t, r, "Secret", "forwarder-migration")
	console := named[*corev1.Secret](t, r, "Secret", "forwarder-console")
	if !reflect.DeepEqual(keys(migration.StringData), []string{"DATABASE_MIGRATE_URL"}) || migration.StringData["DATABASE_MIGRATE_URL"] != owner {
		t.Errorf("migration Secret holds %v", keys(migration.StringData))
	}
	if !reflect.DeepEqual(keys(console.StringData), []string{"CONSOLE_DATABASE_URL"}) {
		t.Errorf("console Secret holds %v", keys(console.StringData))
	}
	if got := keys(creds.StringData); slices.Contains(got, "DATABASE_MIGRATE_URL") || slices.Contains(got, "CONSOLE_DATABASE_URL") || !slices.Contains(got, "DATABASE_DIRECT_URL") {
		t.Errorf("credentials Secret holds %v", got)
	}
	for _, s := range []*corev1.Secret{migration, console} {
		if !isHook(r, "Secret", s.Name) {
			t.Errorf("Secret %s is not created before the migration Job", s.Name)
		}
	}
	for _, o := range r.objects {
		b, _ := yaml.Marshal(o.obj)
		if strings.Contains(string(b), "OWNER-PW") && !(o.kind == "Secret" && o.name == "forwarder-migration") {
			t.Errorf("the owner's password appears in %s/%s", o.kind, o.name)
		}
	}
	checkMigrationJob(t, r, one[*batchv1.Job](t, r, "Job"), "DATABASE_MIGRATE_URL", "forwarder-migration", "DATABASE_MIGRATE_URL")
	c := container(t, one[*appsv1.Deployment](t, r, "Deployment").Spec.Template.Spec, "forwarder")
	for name, secret := range map[string]string{"DATABASE_URL": "forwarder-credentials", "DATABASE_DIRECT_URL": "forwarder-credentials", "CONSOLE_DATABASE_URL": "forwarder-console"} {
		if ref := secretRef(c, name); ref == nil || ref.Name != secret || ref.Key != name || (ref.Optional != nil && *ref.Optional) {
			t.Errorf("%s from %+v, want required, Secret %s key %s", name, ref, secret, name)
		}
	}
	if ref := secretRef(c, "DATABASE_MIGRATE_URL"); ref != nil {
		t.Errorf("the service gets DATABASE_MIGRATE_URL (%+v)", ref)
	}

	// Behind PgBouncer without a migration role, the Job migrates on the
	// direct connection (outbox migrate prefers DATABASE_DIRECT_URL).
	pooled := render(t, map[string]any{"database": map[string]any{"directURL": true}})
	job := container(t, one[*batchv1.Job](t, pooled, "Job").Spec.Template.Spec, "migrate")
	if len(job.Env) != 2 || secretRef(job, "DATABASE_URL") == nil || secretRef(job, "DATABASE_DIRECT_URL") == nil {
		t.Errorf("migration env %+v, want DATABASE_URL and DATABASE_DIRECT_URL", job.Env)
	}
}

// secretRef is the Secret reference of variable name in c, nil when it is
// not set from a Secret.
func secretRef(c corev1.Container, name string) *corev1.SecretKeySelector {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// TestChartLint runs Helm's own linter (helm lint) with both value sets.
func TestChartLint(t *testing.T) {
	t.Parallel()
	for name, vals := range map[string]map[string]any{
		"default":    nil,
		"production": valuesFile(t, "ci/production-values.yaml"),
	} {
		lint := action.NewLint()
		lint.Namespace = namespace
		res := lint.Run([]string{chartDir(t)}, vals)
		for _, err := range res.Errors {
			t.Errorf("helm lint (%s values): %v", name, err)
		}
		for _, m := range res.Messages {
			t.Logf("helm lint (%s values): %s", name, m)
		}
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// checkPod: non-root as the image's user, read-only root filesystem, no
// capabilities, no privilege escalation, the runtime's seccomp profile, no
// API token.
func checkPod(t *testing.T, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || sc == nil {
		t.Fatal("no pod or container securityContext")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != imageUID {
		t.Errorf("pod securityContext runAsNonRoot %v runAsUser %v, want true and %d", psc.RunAsNonRoot, psc.RunAsUser, imageUID)
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile %v, want RuntimeDefault", psc.SeccompProfile)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the root filesystem is writable")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != imageUID {
		t.Errorf("container runAsUser %v, want %d", sc.RunAsUser, imageUID)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; the forwarder never calls the API")
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("resources %+v: want a memory limit and a CPU request", c.Resources)
	}
}

// checkProbesAndPorts: liveness /ping, readiness /ready, both on the named
// port http, which is HTTP_ADDR's and the image's EXPOSE.
func checkProbesAndPorts(t *testing.T, c corev1.Container) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 4195 {
		t.Fatalf("ports %+v, want http 4195", c.Ports)
	}
	if df := parseDockerfile(t); !slices.Contains(df.final.expose, "4195") {
		t.Errorf("the image exposes %v, the chart uses 4195", df.final.expose)
	}
	if got := envValue(c, "HTTP_ADDR"); got != "0.0.0.0:4195" {
		t.Errorf("HTTP_ADDR %q, want 0.0.0.0:4195 (the probes and the Service use that port)", got)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, "/ping"},
		{"readiness", c.ReadinessProbe, "/ready"},
		{"startup", c.StartupProbe, "/ping"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s HTTP probe", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe GET %s on port %s, want %s on http", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}
	df := parseDockerfile(t)
	if !slices.Equal(c.Args, df.final.cmd) || len(c.Command) != 0 {
		t.Errorf("container command %q args %q; want the image's entrypoint with args %q (its CMD)", c.Command, c.Args, df.final.cmd)
	}
}

// checkConfigVolumes: the pipeline and the mappings come from ConfigMaps
// mounted as whole directories over the image's copies; never subPath,
// whose files the kubelet never updates.
func checkConfigVolumes(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := container(t, spec, "forwarder")
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	want := map[string]string{pipelinesDir: "forwarder-pipelines", mappingsDir: "forwarder-mappings"}
	df := parseDockerfile(t)
	for path, cm := range want {
		if !slices.Contains(df.final.copyDests, path) {
			t.Errorf("%s is not a directory the image copies (%v): the mount would not replace the shipped files", path, df.final.copyDests)
		}
		var found bool
		for _, m := range c.VolumeMounts {
			if m.MountPath != path {
				continue
			}
			found = true
			if m.SubPath != "" || m.SubPathExpr != "" {
				t.Errorf("%s is mounted with subPath %q: ConfigMap updates would never reach the pod", path, m.SubPath+m.SubPathExpr)
			}
			if !m.ReadOnly {
				t.Errorf("%s is mounted writable", path)
			}
			v := volumes[m.Name]
			if v.ConfigMap == nil || v.ConfigMap.Name != cm {
				t.Errorf("%s is volume %q (%+v), want ConfigMap %s", path, m.Name, v.VolumeSource, cm)
			}
			if v.ConfigMap != nil && len(v.ConfigMap.Items) != 0 {
				t.Errorf("%s projects only some keys (%v)", path, v.ConfigMap.Items)
			}
		}
		if !found {
			t.Errorf("nothing mounted at %s", path)
		}
	}
	var tmp bool
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/tmp" && volumes[m.Name].EmptyDir != nil {
			tmp = true
		}
	}
	if !tmp {
		t.Error("no emptyDir at /tmp: with a read-only root nothing can write a temporary file")
	}
	if !strings.HasPrefix(df.final.cmd[len(df.final.cmd)-1], pipelinesDir+"/") {
		t.Errorf("the image runs %q, not a pipeline under %s", df.final.cmd, pipelinesDir)
	}
}

// checkGracePeriod: the kubelet waits longer than the service's own
// shutdown timeout before it kills the process.
func checkGracePeriod(t *testing.T, d *appsv1.Deployment, c corev1.Container) {
	t.Helper()
	shutdown, err := time.ParseDuration(envValue(c, "SHUTDOWN_TIMEOUT"))
	if err != nil {
		t.Fatalf("SHUTDOWN_TIMEOUT: %v", err)
	}
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v, want more than SHUTDOWN_TIMEOUT %v", grace, shutdown)
	}
}

// checkSecretRefs: every secret variable comes from the Secret (keys maps
// a variable to its key when it is not the variable's name); only the
// optional ones may be missing.
func checkSecretRefs(t *testing.T, c corev1.Container, secret string, keys map[string]string) {
	t.Helper()
	for _, name := range secretVars {
		var ev *corev1.EnvVar
		for i := range c.Env {
			if c.Env[i].Name == name {
				if ev != nil {
					t.Errorf("%s is set twice", name)
				}
				ev = &c.Env[i]
			}
		}
		if ev == nil {
			t.Errorf("%s is not set", name)
			continue
		}
		ref := ev.ValueFrom
		if ev.Value != "" || ref == nil || ref.SecretKeyRef == nil {
			t.Errorf("%s is not taken from a Secret: %+v", name, ev)
			continue
		}
		key := name
		if k, ok := keys[name]; ok {
			key = k
		}
		if ref.SecretKeyRef.Name != secret || ref.SecretKeyRef.Key != key {
			t.Errorf("%s from Secret %s key %s, want %s key %s", name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key, secret, key)
		}
		optional := ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional
		if optional != optionalSecrets[name] {
			t.Errorf("%s optional=%v, want %v", name, optional, optionalSecrets[name])
		}
	}
}

// pipelineVar matches a variable reference in a Benthos config; the second
// group is ":" when the reference has an empty default (`${NAME:}`).
var pipelineVar = regexp.MustCompile(`\$\{([A-Z][A-Z0-9_]*)(:\})?`)

// checkEnvCoversPipeline: every variable the shipped pipeline reads, and
// every documented one, is set in the container.
func checkEnvCoversPipeline(t *testing.T, c corev1.Container) {
	t.Helper()
	set := map[string]bool{}
	for _, e := range c.Env {
		set[e.Name] = true
	}
	needed := map[string]bool{}
	emptyDefault := map[string]bool{}
	for _, m := range pipelineVar.FindAllStringSubmatch(readRepo(t, "pipelines/forwarder.yaml"), -1) {
		needed[m[1]] = true
		if m[2] != "" {
			emptyDefault[m[1]] = true
		}
	}
	for _, v := range contractVars {
		needed[v] = true
	}
	var missing []string
	for v := range needed {
		// A variable whose default is empty (OUTBOX_RETENTION, the CA
		// files) may stay unset: the chart leaves empty values out.
		if !set[v] && !emptyDefault[v] {
			missing = append(missing, v)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the container does not set %v (add them to values.yaml env:)", missing)
	}
}

// checkMigrationJob: `forwarder outbox migrate` as a pre-install and
// pre-upgrade hook, deleted once it succeeded, with one database URL (name)
// from a Secret and the same restrictions as the service.
func checkMigrationJob(t *testing.T, r *rendered, job *batchv1.Job, name, secret, key string) {
	t.Helper()
	if !isHook(r, "Job", job.Name) {
		t.Error("the migration Job is not a hook")
	}
	a := job.Annotations
	if a["helm.sh/hook"] != "pre-install,pre-upgrade" {
		t.Errorf("migration hook %q, want pre-install,pre-upgrade", a["helm.sh/hook"])
	}
	if a["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
		t.Errorf("migration hook delete policy %q", a["helm.sh/hook-delete-policy"])
	}
	hookWeight(t, a)
	spec := job.Spec.Template.Spec
	if spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s", spec.RestartPolicy)
	}
	c := container(t, spec, "migrate")
	if !slices.Equal(c.Args, []string{"outbox", "migrate", "--lock-timeout", "2s", "--lock-wait", "5m"}) {
		t.Errorf("migration args %q", c.Args)
	}
	checkPod(t, spec, c)
	if len(c.Env) != 1 || c.Env[0].Name != name || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.SecretKeyRef == nil ||
		c.Env[0].ValueFrom.SecretKeyRef.Name != secret || c.Env[0].ValueFrom.SecretKeyRef.Key != key {
		t.Errorf("migration env %+v, want only %s from Secret %s key %s", c.Env, name, secret, key)
	}
	if spec.ServiceAccountName == "forwarder" {
		t.Error("the migration Job runs as the chart's service account, which does not exist yet at pre-install")
	}
}

// checkServiceAndPDB: both select exactly the Deployment's pods.
func checkServiceAndPDB(t *testing.T, r *rendered, d *appsv1.Deployment) {
	t.Helper()
	pods := d.Spec.Template.Labels
	if !reflect.DeepEqual(d.Spec.Selector.MatchLabels, map[string]string{
		"app.kubernetes.io/name": "forwarder", "app.kubernetes.io/instance": releaseName,
	}) || !matches(d.Spec.Selector.MatchLabels, pods) {
		t.Errorf("Deployment selector %v, pod labels %v", d.Spec.Selector.MatchLabels, pods)
	}
	svc := one[*corev1.Service](t, r, "Service")
	if !matches(svc.Spec.Selector, pods) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" || svc.Spec.Ports[0].Name != "http" {
		t.Errorf("Service selector %v ports %+v", svc.Spec.Selector, svc.Spec.Ports)
	}
	pdb := one[*policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget")
	if pdb.Spec.Selector == nil || !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget selector %v", pdb.Spec.Selector)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
}

// checkConfigMapsShipRepoFiles: the pods get the repository's pipeline and
// mappings byte for byte.
func checkConfigMapsShipRepoFiles(t *testing.T, r *rendered) {
	t.Helper()
	p := named[*corev1.ConfigMap](t, r, "ConfigMap", "forwarder-pipelines")
	if !reflect.DeepEqual(keys(p.Data), []string{"forwarder.yaml"}) || p.Data["forwarder.yaml"] != readRepo(t, "pipelines/forwarder.yaml") {
		t.Errorf("the pipelines ConfigMap (%v) does not hold pipelines/forwarder.yaml as is", keys(p.Data))
	}
	m := named[*corev1.ConfigMap](t, r, "ConfigMap", "forwarder-mappings")
	entries, err := os.ReadDir(filepath.Join(repoRoot(t), "mappings"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".blobl") || strings.HasSuffix(e.Name(), "_test.yaml") {
			want = append(want, e.Name())
			if m.Data[e.Name()] != readRepo(t, "mappings/"+e.Name()) {
				t.Errorf("the mappings ConfigMap's %s differs from mappings/%s", e.Name(), e.Name())
			}
		}
	}
	if got := keys(m.Data); !reflect.DeepEqual(got, want) {
		t.Errorf("the mappings ConfigMap holds %v, mappings/ has %v", got, want)
	}
}

// alertGroups decodes deploy/prometheus/alerts.yml strictly into the
// Prometheus Operator's rule groups.
func alertGroups(t *testing.T) []monitoringv1.RuleGroup {
	t.Helper()
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict([]byte(readRepo(t, "deploy/prometheus/alerts.yml")), &file); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yml: %v", err)
	}
	return file.Groups
}

func isHook(r *rendered, kind, name string) bool {
	for _, o := range r.all(kind) {
		if o.name == name {
			return o.hook
		}
	}
	return false
}

func hookWeight(t *testing.T, a map[string]string) int {
	t.Helper()
	var w int
	if _, err := fmt.Sscan(a["helm.sh/hook-weight"], &w); err != nil {
		t.Errorf("hook-weight %q: %v", a["helm.sh/hook-weight"], err)
	}
	return w
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// matches reports whether every selector label is among labels.
func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func readRepo(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
