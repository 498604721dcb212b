package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

// object is one rendered manifest, decoded strictly into its Go type.
type object struct {
	Kind, Name string
	Obj        any
	Raw        map[string]any
}

// serviceMonitor and prometheusRule are the fields the chart uses of the
// prometheus-operator CRDs (not in k8s.io/api), so that they too are
// decoded with unknown fields rejected.
type serviceMonitor struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   json.RawMessage `json:"metadata"`
	Spec       struct {
		Selector  json.RawMessage `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
			// RelabelConfig of the operator's API: the fields the chart sets.
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// podMonitor scrapes the sidecars in the application's pods.
type podMonitor struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   json.RawMessage `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   json.RawMessage `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// typeOf maps apiVersion/kind to a fresh value of its Go type.
func typeOf(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/Pod":
		return &corev1.Pod{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, nil
	case "monitoring.coreos.com/v1/PodMonitor":
		return &podMonitor{}, nil
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &prometheusRule{}, nil
	}
	return nil, fmt.Errorf("no Go type for %s %s", apiVersion, kind)
}

// decodeStrict decodes a multi-document YAML stream into typed objects,
// rejecting unknown fields and duplicate keys.
func decodeStrict(t *testing.T, manifests string) []object {
	t.Helper()
	objs, err := decodeDocs(manifests)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func decodeDocs(manifests string) ([]object, error) {
	var out []object
	dec := yaml.NewDecoder(strings.NewReader(manifests))
	for {
		var node yaml.Node
		err := dec.Decode(&node)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("rendered YAML: %w", err)
		}
		doc, err := yaml.Marshal(&node)
		if err != nil {
			return nil, err
		}
		var raw map[string]any
		if err := yaml.Unmarshal(doc, &raw); err != nil || raw == nil {
			continue // an empty document
		}
		apiVersion, _ := raw["apiVersion"].(string)
		kind, _ := raw["kind"].(string)
		obj, err := typeOf(apiVersion, kind)
		if err != nil {
			return nil, err
		}
		js, err := sigsyaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		// The API server's own strict decoding: field names match case
		// sensitively (encoding/json would take restartpolicy for
		// restartPolicy), unknown and duplicate fields are errors.
		strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %v: strict decode: %w", kind, dig(raw, "metadata", "name"), err)
		}
		name, _ := dig(raw, "metadata", "name").(string)
		out = append(out, object{Kind: kind, Name: name, Obj: obj, Raw: raw})
	}
}

// find returns the objects of one kind.
func find[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.Obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// checkHardened checks what every delayd container must have.
func checkHardened(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: container %s lacks runAsNonRoot", where, c.Name)
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: container %s lacks seccomp RuntimeDefault", where, c.Name)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container %s allows privilege escalation", where, c.Name)
	}
}

// probePath returns a probe's HTTP path, "" when there is none.
func probePath(p *corev1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		return ""
	}
	return p.HTTPGet.Path
}

// TestDecodeStrictRejects: the decoder the manifests are checked with
// refuses unknown and misplaced fields, at any depth.
func TestDecodeStrictRejects(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          restartpolicy: Always\n",
		"apiVersion: v1\nkind: Service\nspec:\n  ports:\n    - {name: a, port: 1, targetport: a}\n",
		"apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\ndata2: {}\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nspec:\n  endpoints: [{port: a, scrapeEvery: 1s}]\n",
		"apiVersion: v1\nkind: Widget\n",
	} {
		if _, err := decodeDocs(doc); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
	if _, err := decodeDocs("apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n"); err != nil {
		t.Errorf("a valid ConfigMap: %v", err)
	}
}
