package validate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/forwarder/forwarder/deploy/validate/chartfiles"
)

const (
	releaseName = "forwarder"
	namespace   = "parking"
	// kubeVersion is the cluster version rendered for; the chart requires
	// at least 1.25.
	kubeVersion = "v1.30.0"
)

// repoRoot is the repository root, two levels above this module.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Dockerfile")); err != nil {
		t.Fatalf("the repository root is not two levels above deploy/validate: %v", err)
	}
	return root
}

func chartDir(t testing.TB) string {
	return filepath.Join(repoRoot(t), chartfiles.ChartDir)
}

// valuesFile reads a values file of the chart (relative to the chart).
func valuesFile(t testing.TB, name string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(filepath.Join(chartDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rendered is a chart rendered as `helm install --dry-run` would for a
// release "forwarder" in namespace "parking": every object, hooks
// included, decoded strictly into its API type.
type rendered struct {
	objects []object
	notes   string
}

type object struct {
	kind, name string
	source     string // the template it came from
	hook       bool
	obj        any // *appsv1.Deployment, *corev1.Secret, ...
}

// newObject is the typed object for an apiVersion and kind; an object of
// a kind not listed here fails the test, so a new template gets a type.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "batch/v1/Job":
		return &batchv1.Job{}, true
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1/Secret":
		return &corev1.Secret{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}, true
	}
	return nil, false
}

// renderChart renders the chart with vals (merged over values.yaml, as
// helm does) and returns the error of a render that fails.
func renderChart(t testing.TB, vals map[string]any) (*rendered, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = kv
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, err
	}

	r := &rendered{notes: rel.Info.Notes}
	add := func(source, manifest string, hook bool) {
		for _, doc := range releaseutil.SplitManifests(manifest) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			r.objects = append(r.objects, decodeStrict(t, source, []byte(doc), hook))
		}
	}
	add("manifest", rel.Manifest, false)
	for _, h := range rel.Hooks {
		add(h.Path, h.Manifest, true)
	}
	sort.Slice(r.objects, func(i, j int) bool {
		return r.objects[i].kind+"/"+r.objects[i].name < r.objects[j].kind+"/"+r.objects[j].name
	})
	return r, nil
}

// render is renderChart for values that must render.
func render(t testing.TB, vals map[string]any) *rendered {
	t.Helper()
	r, err := renderChart(t, vals)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	return r
}

// decodeStrict decodes one rendered document into its API type. Unknown
// and duplicate fields fail (sigs.k8s.io/yaml's UnmarshalStrict: JSON
// decoding with DisallowUnknownFields), and so do names and labels the API
// server would refuse.
func decodeStrict(t testing.TB, source string, doc []byte, hook bool) object {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		t.Fatalf("%s: not YAML: %v\n%s", source, err, doc)
	}
	obj, ok := newObject(tm.APIVersion, tm.Kind)
	if !ok {
		t.Fatalf("%s: %s %s has no API type in this test (add it to newObject)", source, tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("%s: %s does not decode strictly into its API type: %v\n%s", source, tm.Kind, err, doc)
	}
	meta := obj.(metav1.Object)
	for _, msg := range validation.IsDNS1123Subdomain(meta.GetName()) {
		t.Errorf("%s: %s name %q: %s", source, tm.Kind, meta.GetName(), msg)
	}
	if tm.Kind == "Service" {
		for _, msg := range validation.IsDNS1035Label(meta.GetName()) {
			t.Errorf("%s: Service name %q: %s", source, meta.GetName(), msg)
		}
	}
	checkLabels(t, source, meta.GetLabels())
	return object{kind: tm.Kind, name: meta.GetName(), source: source, hook: hook, obj: obj}
}

func checkLabels(t testing.TB, source string, labels map[string]string) {
	t.Helper()
	for k, v := range labels {
		for _, msg := range validation.IsQualifiedName(k) {
			t.Errorf("%s: label key %q: %s", source, k, msg)
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			t.Errorf("%s: label %s value %q: %s", source, k, v, msg)
		}
	}
}

// all returns the objects of kind.
func (r *rendered) all(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of kind, typed.
func one[T any](t testing.TB, r *rendered, kind string) T {
	t.Helper()
	objs := r.all(kind)
	if len(objs) != 1 {
		t.Fatalf("want exactly one %s, rendered %d: %s", kind, len(objs), r.summary())
	}
	return objs[0].obj.(T)
}

// named returns the object of kind with name, typed.
func named[T any](t testing.TB, r *rendered, kind, name string) T {
	t.Helper()
	for _, o := range r.all(kind) {
		if o.name == name {
			return o.obj.(T)
		}
	}
	t.Fatalf("no %s %q rendered: %s", kind, name, r.summary())
	var zero T
	return zero
}

func (r *rendered) summary() string {
	var b bytes.Buffer
	for _, o := range r.objects {
		fmt.Fprintf(&b, "\n  %s/%s (%s)", o.kind, o.name, o.source)
	}
	return b.String()
}
