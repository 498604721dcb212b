package deploy

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
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
	{config: `limits: {max_delay: "0"}`, key: "limits.max_delay"},
	{config: `limits: {max_jitter: "0"}`, key: "limits.max_jitter"},
	// Issue 38: each of these rendered, and the pods crash-looped.
	{config: `nats: {url: ""}`, key: "nats.url"},
	{config: `redis: {addrs: []}`, key: "redis.addrs"},
	{config: `redis: {addrs: [redis]}`, key: "redis.addrs"},
	{config: `namespace: ""`, key: "namespace"},
	{config: `namespace: "app{1}"`, key: "namespace"},
	{config: `subject: ""`, key: "subject"},
	{config: `subject: "delayd.*"`, key: "subject"},
	{config: `subject: "delayd..x"`, key: "subject"},
	{config: `nats: {inbox_prefix: ""}`, key: "nats.inbox_prefix"},
	{config: `nats: {inbox_prefix: replies}`, key: "nats.inbox_prefix"},
	{config: `nats: {inbox_prefix: "_INBOX.>"}`, key: "nats.inbox_prefix"},
	{config: `intake: {stream: {name: ""}}`, key: "intake.stream.name"},
	{config: `intake: {stream: {name: DELAYD.INTAKE}}`, key: "intake.stream.name"},
	{config: `intake: {stream: {name: "` + strings.Repeat("N", 246) + `"}}`, key: "intake.stream.name"},
	{config: `mode: both`, key: "mode"},
	{config: `nats: {tls: {cert_file: /tls/c.pem}}`, key: "nats.tls"},
	{config: `redis: {tls: {key_file: /tls/k.pem}}`, key: "redis.tls"},
	{config: `redis: {cluster: true, master_name: mymaster}`, key: "redis"},
	{config: `redis: {eviction_check: maybe}`, key: "redis.eviction_check"},
	{config: `redis: {wait_claims: strict}`, key: "redis.wait_claims"},
	{config: `redis: {wait_claims: always}`, key: "redis.wait_claims"},
	{config: `scanner: {idle_interval: 0s}`, key: "scanner.idle_interval"},
	{config: `scanner: {retry_backoff: "0"}`, key: "scanner.retry_backoff"},
	{config: `scanner: {retry_backoff_max: -1s}`, key: "scanner.retry_backoff_max"},
	{config: `scanner: {no_interest_retry_for: -1m}`, key: "scanner.no_interest_retry_for"},
	{config: `intake: {max_batch: 0}`, key: "intake.max_batch"},
	{config: `intake: {max_batch: 100001}`, key: "intake.max_batch"},
	{config: `intake: {linger: -1ms}`, key: "intake.linger"},
	{config: `intake: {stream: {enabled: maybe}}`, key: "intake.stream.enabled"},
	{config: `intake: {stream: {enabled: false}}`, key: "intake.stream.enabled"}, // unquoted
	{config: `intake: {stream: {retention: interest}}`, key: "intake.stream.retention"},
	{config: `intake: {stream: {max_age: -1h}}`, key: "intake.stream.max_age"},
	{config: `intake: {stream: {retry_delay: 0s}}`, key: "intake.stream.retry_delay"},
	{config: `shutdown: {timeout: 0s}`, key: "shutdown.timeout"},
	{config: `http: {addr: "9479"}`, key: "http.addr"},
	{config: `http: {sample_interval: 0ms}`, key: "http.sample_interval"},
	{config: `ui: {addr: "9480"}`, key: "ui.addr"},
	{config: `headers: {allow_nats: [Msg-Id]}`, key: "headers.allow_nats"},
	{config: `targets: {allow: ["orders.>.x"]}`, key: "targets.allow"},
	{config: `targets: {deny: [""]}`, key: "targets.deny"},
	{config: `targets: {jetstream: ["orders.a*"]}`, key: "targets.jetstream"},
	{config: `targets: {fire_and_forget: ["a b"]}`, key: "targets.fire_and_forget"},
	{config: `targets: {limits: ["orders.> 500"]}`, key: "targets.limits"},
	{config: `targets: {limits: ["orders.> 500/d"]}`, key: "targets.limits"},
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
	{config: `namespace: my-app`},
	{config: `subject: svc.delayd`},
	{config: `targets: {limits: ["orders.> 500/s 50", "mail.send 14/m"]}`},
	{config: `nats: {inbox_prefix: _inbox_ops}`},
	{config: `nats: {inbox_prefix: _INBOX.ops.a}`},
	{config: `nats: {tls: {cert_file: /tls/c.pem, key_file: /tls/k.pem}}`},
	{config: `intake: {stream: {name: MY_INTAKE-2, enabled: "true", retry_delay: 10ms}}`},
	{config: `intake: {max_batch: 100000, linger: 0s}`},
	{config: `redis: {addrs: ["redis-0:6379", "redis-1:6379"], cluster: true, master_name: ""}`},
	{config: `redis: {wait_claims: strict, wait_replicas: 1}`},
	{config: `redis: {wait_claims: strict, wait_local_fsync: true}`},
	{config: `scanner: {retry_backoff_max: "0", no_interest_retry_for: 0s, idle_interval: 1ms}`},
	{config: `limits: {max_delay: 1h}`},
	{config: `limits: {max_jitter: 2s}`},
	{config: `http: {sample_interval: 500ms}`},
	{config: `ui: {addr: ""}`},
	{config: `headers: {allow_nats: [Nats-Msg-Id]}`},
	{config: `targets: {allow: [">", "orders.*.paid", "orders.>"], deny: ["$SYS.>"], jetstream: ["*"]}`},
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
		out, err := tryRun(h, "template", "rel", chartDir, "-f", values)
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

// notInSchema are refusals of internal/config's Validate that JSON schema
// cannot state, each with why; delayd still refuses them at start.
var notInSchema = map[string]string{
	"ownership.ttl":               "at least 300ms: the schema reads a duration's unit, not its size",
	"scanner.lease":               "at least 200ms: the schema reads a duration's unit, not its size",
	"scanner.check_interval":      "0 or at least 1s: the schema reads a duration's unit, not its size",
	"intake.dedupe_window":        "0 or 1s..24h: the schema reads a duration's unit, not its size",
	"intake.stream.ack_wait":      "at least 1s: the schema reads a duration's unit, not its size",
	"intake.stream.dedupe_window": "at least twice ack_wait: a comparison of two durations",
	"redis.wait_timeout":          "1ms..4s and a quarter of scanner.lease: a comparison of two durations",
	"limits.max_past":             "at most 100 years: the schema reads a duration's unit, not its size",
	"nats":                        "one authentication method: the password and token are in secrets, existingSecret or extraEnv, which the schema cannot all see",
}

// validateRefusals returns the keys internal/config's Validate refuses
// values of: the key argument of every bad(...) and positive(...) call of
// validate.go, and the keys of the tables its loops go through.
func validateRefusals(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../internal/config/validate.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	lit := func(e ast.Expr) {
		if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil && regexp.MustCompile(`^[a-z_]+(\.[a-z_]+)*$`).MatchString(s) {
				keys[s] = true
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && (id.Name == "bad" || id.Name == "positive") && len(n.Args) > 0 {
				lit(n.Args[0])
			}
		case *ast.CompositeLit: // {"targets.allow", c.Targets.Allow} or map[string]TLS{"nats.tls": ...}
			for _, e := range n.Elts {
				switch e := e.(type) {
				case *ast.KeyValueExpr:
					lit(e.Key)
				case *ast.CompositeLit:
					if len(e.Elts) > 0 {
						lit(e.Elts[0])
					}
				}
			}
		}
		return true
	})
	return slices.Sorted(maps.Keys(keys))
}

// TestSchemaRefusesEveryRefusal: every key internal/config's Validate
// refuses a value of has a case in refusedByBoth (so the schema refuses
// it too, TestSchemaRefusesWhatDelaydRefuses checks both) or a reason in
// notInSchema. A refusal added to Validate without either fails here.
func TestSchemaRefusesEveryRefusal(t *testing.T) {
	t.Parallel()
	refusals := validateRefusals(t)
	if len(refusals) < 40 {
		t.Fatalf("found %d refusals in validate.go: the walk no longer reads it", len(refusals))
	}
	cased := map[string]bool{}
	for _, c := range refusedByBoth {
		cased[c.key] = true
	}
	for _, key := range refusals {
		_, exempt := notInSchema[key]
		switch {
		case cased[key] && exempt:
			t.Errorf("%s has a case in refusedByBoth and a reason in notInSchema: drop the reason", key)
		case !cased[key] && !exempt:
			t.Errorf("delayd refuses values of %s at start and refusedByBoth has no case for it: the chart would render a pod that crash-loops", key)
		}
	}
	for key := range notInSchema {
		if !slices.Contains(refusals, key) {
			t.Errorf("notInSchema names %s, which Validate does not refuse", key)
		}
	}
}
