package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeYAML(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "delayd.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A bare YAML integer for a duration was once taken as nanoseconds:
// scanner.lease: 5 was a 5 ns lease.
func TestDurationNeedsUnit(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  Sources
		want []string
	}{
		{"yaml int", Sources{Path: writeYAML(t, "scanner:\n  lease: 5\n")}, []string{"scanner.lease", "5s"}},
		{"yaml quoted int", Sources{Path: writeYAML(t, "http:\n  sample_interval: \"1\"\n")}, []string{"http.sample_interval", "1s"}},
		{"env", Sources{Getenv: env(map[string]string{"DELAYD_SCANNER_LEASE": "5"})}, []string{"scanner.lease", "DELAYD_SCANNER_LEASE", "5s"}},
		{"flag", Sources{Flags: map[string]string{"scanner.lease": "5"}}, []string{"scanner.lease", "5s"}},
		{"env empty", Sources{Getenv: env(nil), Environ: []string{"DELAYD_SCANNER_LEASE="}}, []string{"DELAYD_SCANNER_LEASE", "empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.src)
			if err == nil {
				t.Fatal("a duration without a unit was accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q: %v", w, err)
				}
			}
		})
	}
	// With units, and a bare 0 (the same in every unit), it loads.
	c, err := Load(Sources{Path: writeYAML(t, "scanner:\n  lease: 5s\n  check_interval: 0\n")})
	if err != nil {
		t.Fatal(err)
	}
	if c.Scanner.Lease != 5*time.Second || c.Scanner.CheckInterval != 0 {
		t.Errorf("lease %s, check_interval %s", c.Scanner.Lease, c.Scanner.CheckInterval)
	}
}

func TestUnknownEnvSuggestsNearest(t *testing.T) {
	_, err := Load(Sources{Getenv: env(map[string]string{"DELAYD_REDIS_ADDR": "r:6379"}),
		Environ: []string{"DELAYD_REDIS_ADDR=r:6379", "PATH=/bin"}})
	if err == nil {
		t.Fatal("a mistyped DELAYD_ variable was ignored")
	}
	if !strings.Contains(err.Error(), "DELAYD_REDIS_ADDR") || !strings.Contains(err.Error(), "did you mean DELAYD_REDIS_ADDRS?") {
		t.Errorf("want the variable and the nearest known one named: %v", err)
	}
	// Variables read elsewhere than the config pass.
	var environ []string
	for _, n := range OtherEnv {
		environ = append(environ, n+"=1")
	}
	if _, err := Load(Sources{Environ: environ}); err != nil {
		t.Errorf("allow-listed variables refused: %v", err)
	}
}

// Every problem is reported at once and in full: a type error does not
// hide the others, and values are not cut short.
func TestEveryErrorTogether(t *testing.T) {
	path := writeYAML(t, "shards: many\nscanner:\n  lease: five seconds\n  max_attempts: 0\nlog:\n  level: loud\nshard: 3\n")
	_, err := Load(Sources{Path: path, Getenv: env(map[string]string{"DELAYD_HTTP_SAMPLE_INTERVAL": "five", "DELAYD_NATS_URLS": "x"}),
		Environ: []string{"DELAYD_HTTP_SAMPLE_INTERVAL=five", "DELAYD_NATS_URLS=x"}})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, w := range []string{`shards (in `, `"many"`, `scanner.lease (in `, `"five seconds"`, "scanner.max_attempts:", "log.level:",
		"shard (in ", "did you mean shards?", `http.sample_interval (env DELAYD_HTTP_SAMPLE_INTERVAL): "five" is not a duration`,
		"DELAYD_NATS_URLS: unknown variable: did you mean DELAYD_NATS_URL?"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// A variable set to "" sets a string key to "" (DELAYD_HTTP_ADDR= turns
// the admin server off) and a list to no entries.
func TestEmptyEnv(t *testing.T) {
	c, err := Load(Sources{Getenv: env(nil), Environ: []string{"DELAYD_HTTP_ADDR=", "DELAYD_UI_REDACT_HEADERS="}})
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Addr != "" || len(c.UI.RedactHeaders) != 0 {
		t.Errorf("http.addr %q, ui.redact_headers %v: want both empty", c.HTTP.Addr, c.UI.RedactHeaders)
	}
	// Unset, the default stays.
	if c, _ := Load(Sources{}); c.HTTP.Addr != Default().HTTP.Addr {
		t.Errorf("unset DELAYD_HTTP_ADDR changed http.addr to %q", c.HTTP.Addr)
	}
}

// `delayd config` prints YAML that loads again, durations with units.
func TestYAMLRoundTrip(t *testing.T) {
	b, err := Default().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "lease: 10s") {
		t.Errorf("durations not written with units:\n%s", b)
	}
	c, err := Load(Sources{Path: writeYAML(t, string(b))})
	if err != nil {
		t.Fatalf("config output does not load: %v", err)
	}
	if c.Scanner.Lease != Default().Scanner.Lease {
		t.Errorf("lease %s after the round trip", c.Scanner.Lease)
	}
}

// A key that was removed is refused with what to do instead, in a file,
// the environment and a flag.
func TestRemovedKeySaysWhatToDo(t *testing.T) {
	path := writeYAML(t, "redis:\n  due_buckets: true\n")
	_, err := Load(Sources{Path: path, Getenv: env(map[string]string{"DELAYD_REDIS_DUE_BUCKETS": "true"}),
		Environ: []string{"DELAYD_REDIS_DUE_BUCKETS=true"}, Flags: map[string]string{"redis.due_buckets": "true"}})
	if err == nil {
		t.Fatal("a removed key was accepted")
	}
	for _, w := range []string{"redis.due_buckets (in ", "DELAYD_REDIS_DUE_BUCKETS: ", "redis.due_buckets (flag): ", "delayd migrate"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
	if strings.Contains(err.Error(), "did you mean") {
		t.Errorf("a removed key is not a typo:\n%v", err)
	}
}
