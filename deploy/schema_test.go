package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/config"
)

// TestSchemaKnowsEveryConfigKey: the chart's schema lists exactly delayd's
// config keys (so it refuses unknown ones, as delayd does), and every
// duration key needs a unit. A key added to the config without the schema,
// or the other way round, fails here.
func TestSchemaKnowsEveryConfigKey(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	type node struct {
		Type                 string                     `json:"type"`
		Pattern              string                     `json:"pattern"`
		AdditionalProperties *bool                      `json:"additionalProperties"`
		Properties           map[string]json.RawMessage `json:"properties"`
	}
	inSchema := map[string]node{}
	var walk func(prefix string, raw json.RawMessage)
	walk = func(prefix string, raw json.RawMessage) {
		var n node
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatal(err)
		}
		if n.Properties == nil {
			inSchema[prefix] = n
			return
		}
		if n.AdditionalProperties == nil || *n.AdditionalProperties {
			t.Errorf("schema %q allows unknown keys", prefix)
		}
		for k, v := range n.Properties {
			walk(strings.TrimPrefix(prefix+"."+k, "."), v)
		}
	}
	walk("", schema.Properties["config"])

	inConfig := map[string]reflect.Type{}
	var fields func(prefix string, tp reflect.Type)
	fields = func(prefix string, tp reflect.Type) {
		for i := range tp.NumField() {
			f := tp.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			k := strings.TrimPrefix(prefix+"."+tag, ".")
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				fields(k, f.Type)
				continue
			}
			inConfig[k] = f.Type
		}
	}
	fields("", reflect.TypeOf(config.Config{}))

	var missing, extra []string
	for k, tp := range inConfig {
		n, ok := inSchema[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		if tp == reflect.TypeOf(time.Duration(0)) && (n.Type != "string" || n.Pattern == "") {
			t.Errorf("schema %q: a duration must be a string with a unit pattern, got %+v", k, n)
		}
	}
	for k := range inSchema {
		if _, ok := inConfig[k]; !ok {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("schema and config differ: keys missing from the schema %v, keys the config lacks %v", missing, extra)
	}
}

// configCase is a delayd config, given to the chart as values.config and
// to delayd as its config file. values are more chart values (the
// secrets), env the same secrets as delayd gets them from the chart.
type configCase struct {
	config string
	key    string // the key delayd's refusal names
	values string
	env    []string
}

// refusedByBoth are values delayd refuses at start. The chart's schema
// must refuse each at helm install, not leave a pod to crash-loop.
var refusedByBoth = []configCase{
	{config: `ui: {addr: "0.0.0.0:9480"}`, key: "ui.addr"},
	{config: `ui: {addr: ":9480"}`, key: "ui.addr"},
	{config: `ui: {addr: "delayd.example.com:9480"}`, key: "ui.addr"},
	{config: `ui: {basic_auth_user: ops}`, key: "ui"}, // no password anywhere
	{config: `log: {level: verbose}`, key: "log.level"},
	{config: `log: {level: ""}`, key: "log.level"},
	{config: `shards: 0`, key: "shards"},
	{config: `shards: 16385`, key: "shards"},
	{config: `redis: {wait_replicas: -1}`, key: "redis.wait_replicas"},
	{config: `redis: {wait_replicas: 17}`, key: "redis.wait_replicas"},
	{config: `scanner: {claim_batch: 0}`, key: "scanner.claim_batch"},
	{config: `scanner: {claim_batch: 4097}`, key: "scanner.claim_batch"},
	{config: `scanner: {claim_bytes: -1}`, key: "scanner.claim_bytes"},
	{config: `scanner: {max_attempts: 0}`, key: "scanner.max_attempts"},
	{config: `scanner: {max_attempts: -3}`, key: "scanner.max_attempts"},
	{config: `intake: {batch: 0}`, key: "intake.batch"},
	{config: `intake: {pending_bytes: -1}`, key: "intake.pending_bytes"},
	{config: `intake: {stream: {replicas: 0}}`, key: "intake.stream.replicas"},
	{config: `intake: {stream: {replicas: 6}}`, key: "intake.stream.replicas"},
	{config: `intake: {stream: {max_bytes: -1}}`, key: "intake.stream.max_bytes"},
	{config: `intake: {stream: {pull: 0}}`, key: "intake.stream.pull"},
	{config: `intake: {stream: {pull: 65537}}`, key: "intake.stream.pull"},
	{config: `intake: {stream: {pull_bytes: -1}}`, key: "intake.stream.pull_bytes"},
	{config: `limits: {max_payload: -1}`, key: "limits.max_payload"},
	{config: `limits: {max_id_len: 0}`, key: "limits.max_id_len"},
	{config: `limits: {max_id_len: 257}`, key: "limits.max_id_len"},
	{config: `limits: {max_headers: 0}`, key: "limits.max_headers"},
	{config: `limits: {max_header_bytes: -1}`, key: "limits.max_header_bytes"},
}

// acceptedByBoth are near misses of the cases above that both take.
var acceptedByBoth = []configCase{
	{config: `ui: {addr: "127.0.0.1:9480"}`},
	{config: `ui: {addr: "localhost:9480"}`},
	{config: `ui: {addr: "[::1]:9480"}`},
	{config: `ui: {addr: "0.0.0.0:9480", insecure: true}`},
	{config: `ui: {addr: "0.0.0.0:9480", enabled: false}`},
	{config: `ui: {addr: "0.0.0.0:9480"}`, values: "secrets: {uiBearerToken: s3cret}", env: []string{"DELAYD_UI_BEARER_TOKEN=s3cret"}},
	{config: `ui: {addr: "0.0.0.0:9480", basic_auth_user: ops}`, values: "secrets: {uiBasicAuthPassword: s3cret}",
		env: []string{"DELAYD_UI_BASIC_AUTH_PASSWORD=s3cret"}},
	{config: `log: {level: DEBUG}`},
	{config: `log: {level: "off"}`},
	{config: `redis: {wait_replicas: 16}`},
	{config: `scanner: {claim_batch: 4096, claim_bytes: 0, max_attempts: 1}`},
	{config: `intake: {batch: 1, pending_bytes: 0, stream: {replicas: 5, max_bytes: 0, pull: 65536, pull_bytes: 0}}`},
	{config: `limits: {max_payload: 0, max_id_len: 256, max_headers: 1, max_header_bytes: 1}`},
	{config: `shards: 16384`},
}

// TestSchemaRefusesWhatDelaydRefuses runs each case through the chart
// (helm template with the case as values.config) and through delayd's own
// config loading and validation, so the two cannot drift: a limit changed
// in internal/config without the schema, or the other way round, fails.
func TestSchemaRefusesWhatDelaydRefuses(t *testing.T) {
	t.Parallel()
	h := helm(t)
	dir := t.TempDir()
	check := func(i int, c configCase, refused bool) {
		t.Helper()
		cfg := filepath.Join(dir, fmt.Sprintf("delayd-%v-%d.yaml", refused, i))
		writeFile(t, cfg, []byte(c.config+"\n"))
		env := append([]string(nil), c.env...)
		getenv := func(name string) string {
			for _, kv := range env {
				if n, v, _ := strings.Cut(kv, "="); n == name {
					return v
				}
			}
			return ""
		}
		_, err := config.Load(config.Sources{Path: cfg, Getenv: getenv, Environ: env})
		switch {
		case refused && (err == nil || !strings.Contains(err.Error(), c.key+":") && !strings.Contains(err.Error(), c.key+" ")):
			t.Errorf("delayd takes %s: %v, want a refusal naming %s", c.config, err, c.key)
		case !refused && err != nil:
			t.Errorf("delayd refuses %s: %v", c.config, err)
		}

		values := filepath.Join(dir, fmt.Sprintf("values-%v-%d.yaml", refused, i))
		writeFile(t, values, []byte("config: {"+c.config+"}\n"+c.values+"\n"))
		out, err := tryRun(h, "template", "rel", chartDir, "--kube-version", kubeVersion, "-f", values)
		switch {
		case refused && err == nil:
			t.Errorf("the chart renders %s, which delayd refuses (%s)", c.config, c.key)
		case refused && !strings.Contains(err.Error(), "/config/"+strings.Split(c.key, ".")[0]) && !strings.Contains(err.Error(), c.key):
			t.Errorf("the chart refuses %s without naming %s:\n%v", c.config, c.key, err)
		case !refused && err != nil:
			t.Errorf("the chart refuses %s, which delayd takes:\n%v\n%s", c.config, err, out)
		}
	}
	for i, c := range refusedByBoth {
		check(i, c, true)
	}
	for i, c := range acceptedByBoth {
		check(i, c, false)
	}
}
