// Package deploy holds deployment artifacts; this test keeps the
// Kubernetes manifests honest about what docs/operations.md promises.
package deploy

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
}

func dig(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

// checkContainer checks probes and hardening; ready is the path of the
// startup and readiness probes.
func checkContainer(t *testing.T, where, ready string, c map[string]any) {
	t.Helper()
	for _, probe := range []struct{ name, path string }{
		{"startupProbe", ready}, {"readinessProbe", ready}, {"livenessProbe", "/livez"},
	} {
		if got := dig(c, probe.name, "httpGet", "path"); got != probe.path {
			t.Errorf("%s: %s path %v, want %s", where, probe.name, got, probe.path)
		}
	}
	sc := dig(c, "securityContext")
	if dig(sc, "runAsNonRoot") != true || dig(sc, "readOnlyRootFilesystem") != true || dig(sc, "allowPrivilegeEscalation") != false ||
		dig(sc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("%s: securityContext not hardened: %v", where, sc)
	}
	if dig(c, "resources", "limits", "memory") == nil {
		t.Errorf("%s: no memory limit", where)
	}
}

func TestSidecarManifest(t *testing.T) {
	t.Parallel()
	d := docs(t, "kubernetes/sidecar.yaml")[0]
	inits, _ := dig(d, "spec", "template", "spec", "initContainers").([]any)
	if len(inits) != 1 {
		t.Fatal("no delayd init container")
	}
	c := inits[0].(map[string]any)
	if c["restartPolicy"] != "Always" {
		t.Error("native sidecar needs restartPolicy: Always")
	}
	// A native sidecar's readiness is part of the app pod's Ready
	// condition: it must never follow Redis or NATS (/readyz).
	checkContainer(t, "sidecar", "/livez", c)
	if g, _ := dig(d, "spec", "template", "spec", "terminationGracePeriodSeconds").(int); g < 15 {
		t.Errorf("termination grace %d is shorter than drain deadline plus margin", g)
	}
}

func TestFleetManifest(t *testing.T) {
	t.Parallel()
	ds := docs(t, "kubernetes/fleet.yaml")
	cs, _ := dig(ds[0], "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatal("no delayd container")
	}
	checkContainer(t, "fleet", "/readyz", cs[0].(map[string]any))
}

func TestHelmValuesParse(t *testing.T) {
	t.Parallel()
	v := docs(t, "helm/delayd/values.yaml")[0]
	if v["mode"] != "fleet" || dig(v, "config", "nats", "url") == nil {
		t.Errorf("values: %v", v)
	}
	b, _ := os.ReadFile("helm/delayd/templates/_helpers.tpl")
	if !strings.Contains(string(b), "restartPolicy: Always") {
		t.Error("helm sidecar mode must render a native sidecar")
	}
}

// TestManifestsStrict decodes the plain manifests strictly into their
// k8s.io/api types, like the chart's.
func TestManifestsStrict(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"kubernetes/sidecar.yaml", "kubernetes/fleet.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeDocs(string(b)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestDocsSayHowToBuildTheImage: the chart and the manifests deploy
// ghcr.io/delayd/delayd:<appVersion>, which is pushed only when that
// version is tagged; a checkout always carries the coming version. So
// where a user deploys from (the Deploying section, the chart's NOTES and
// README, the manifests) says so and how to build the image.
func TestDocsSayHowToBuildTheImage(t *testing.T) {
	t.Parallel()
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
		}
		return string(b)
	}
	ops := read("../docs/operations.md")
	i := strings.Index(ops, "\n## Deploying\n")
	if i < 0 {
		t.Fatal("docs/operations.md has no Deploying section")
	}
	section := ops[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	for path, text := range map[string]string{
		"docs/operations.md (Deploying)":  section,
		"helm/delayd/templates/NOTES.txt": read(chartDir + "/templates/NOTES.txt"),
		"helm/delayd/README.md":           read(chartDir + "/README.md"),
		"kubernetes/fleet.yaml":           read("kubernetes/fleet.yaml"),
		"kubernetes/sidecar.yaml":         read("kubernetes/sidecar.yaml"),
	} {
		for _, want := range []string{"docker build -f deploy/Dockerfile", "published"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s does not say %q: the image is pushed only at its release tag", path, want)
			}
		}
	}
}
