package validate

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestChartMemoryAgreesWithTheDocs holds the chart's memory, GOMEMLIMIT and
// what the documentation promises to one value, values.yaml's memory
// (docs/configuration.md#memory): the rendered container's memory request
// and limit are that value and GOMEMLIMIT 70 % of it; the memory that
// docs/configuration.md and the README say messages of 16 MiB need, and the
// bound test/e2e holds the process under with them (at the chart's
// GOMEMLIMIT), fit within it; and
// those pages and docs/deployment.md name the chart's value and the
// GOMEMLIMIT it gives. A change to any of them alone fails here.
func TestChartMemoryAgreesWithTheDocs(t *testing.T) {
	t.Parallel()
	values := valuesFile(t, "values.yaml")
	memory, ok := values["memory"].(string)
	if !ok {
		t.Fatalf("values.yaml: memory is %v, want a size such as 1Gi", values["memory"])
	}
	limit := resource.MustParse(memory)
	goMemLimit := fmt.Sprintf("%dMiB", limit.Value()>>20*7/10)

	d := one[*appsv1.Deployment](t, render(t, nil), "Deployment")
	checkMemory(t, container(t, d.Spec.Template.Spec, "forwarder"), memory, goMemLimit)

	// What 16 MiB messages need, as the pages say it, in GiB.
	need := func(page, pattern string) float64 {
		t.Helper()
		m := regexp.MustCompile(pattern).FindStringSubmatch(readRepo(t, page))
		if m == nil {
			t.Fatalf("%s does not say what 16 MiB messages need (no match for %s)", page, pattern)
		}
		gib, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return gib
	}
	docs := need("docs/configuration.md", `messages can reach 16 MiB, give the container about ([0-9.]+) GiB`)
	readme := need("README.md", `give the process \*\*about ([0-9.]+) GiB\*\*`)
	if docs != readme {
		t.Errorf("docs/configuration.md says 16 MiB messages need about %g GiB, the README %g GiB", docs, readme)
	}
	if need := int64(docs * (1 << 30)); limit.Value() < need {
		t.Errorf("the chart's memory %s is less than the %g GiB docs/configuration.md says 16 MiB messages need", memory, docs)
	}
	// The peak test/e2e holds the process under with 16 MiB messages.
	m := regexp.MustCompile(`(?m)^const memoryBound = 1 << (\d+)$`).FindStringSubmatch(readRepo(t, "test/e2e/memory_test.go"))
	if m == nil {
		t.Fatal("test/e2e/memory_test.go has no `const memoryBound = 1 << N`")
	}
	shift, _ := strconv.Atoi(m[1])
	if bound := int64(1) << shift; bound > limit.Value() {
		t.Errorf("test/e2e allows a peak of %d MiB, more than the chart's memory %s: the pod would be killed first", bound>>20, memory)
	}
	// ... and it measures that peak with the chart's GOMEMLIMIT.
	if m := regexp.MustCompile(`(?m)^const chartGoMemLimit = "([^"]*)"$`).FindStringSubmatch(readRepo(t, "test/e2e/memory_test.go")); m == nil || m[1] != goMemLimit {
		t.Errorf("test/e2e/memory_test.go runs with chartGoMemLimit %v, want the chart's GOMEMLIMIT %q", m, goMemLimit)
	}

	for _, page := range []string{"README.md", "docs/configuration.md", "docs/deployment.md"} {
		text := readRepo(t, page)
		if want := "default, `memory: " + memory + "`"; !strings.Contains(text, want) {
			t.Errorf("%s does not name the chart's default (%q)", page, want)
		}
		if page != "README.md" && !strings.Contains(text, "`"+goMemLimit+"`") {
			t.Errorf("%s does not name the GOMEMLIMIT the chart sets, `%s`", page, goMemLimit)
		}
		if !strings.Contains(text, "70 %") {
			t.Errorf("%s does not say GOMEMLIMIT is 70 %% of the memory", page)
		}
	}
}

// checkMemory: the container's memory request and limit are memory, and
// GOMEMLIMIT is goMemLimit, once.
func checkMemory(t *testing.T, c corev1.Container, memory, goMemLimit string) {
	t.Helper()
	want := resource.MustParse(memory)
	if got := c.Resources.Limits.Memory(); got.Cmp(want) != 0 {
		t.Errorf("memory limit %s, want %s", got, memory)
	}
	if got := c.Resources.Requests.Memory(); got.Cmp(want) != 0 {
		t.Errorf("memory request %s, want %s", got, memory)
	}
	var set []string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			set = append(set, e.Value)
		}
	}
	if len(set) != 1 || set[0] != goMemLimit {
		t.Errorf("GOMEMLIMIT set to %q, want %q once", set, goMemLimit)
	}
}
