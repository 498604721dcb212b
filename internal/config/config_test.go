package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadLayers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "delayd.yaml")
	yaml := "shards: 32\nnats:\n  url: nats://file:4222\nscanner:\n  lease: 3s\nredis:\n  addrs: [a:1, b:2]\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(Sources{Path: path, Getenv: env(map[string]string{
		"DELAYD_NATS_URL":            "nats://env:4222",
		"DELAYD_REDIS_ADDRS":         "x:1, y:2",
		"DELAYD_SCANNER_CLAIM_BATCH": "64",
	}), Flags: map[string]string{"nats.url": "nats://flag:4222"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Shards != 32 || c.Scanner.Lease != 3*time.Second {
		t.Errorf("file layer lost: shards=%d lease=%s", c.Shards, c.Scanner.Lease)
	}
	if c.NATS.URL != "nats://flag:4222" {
		t.Errorf("flag must win over env and file, got %q", c.NATS.URL)
	}
	if strings.Join(c.Redis.Addrs, ",") != "x:1,y:2" || c.Scanner.ClaimBatch != 64 {
		t.Errorf("env layer lost: addrs=%v batch=%d", c.Redis.Addrs, c.Scanner.ClaimBatch)
	}
	if c.Limits.MaxIDLen != 256 {
		t.Errorf("default lost: max_id_len=%d", c.Limits.MaxIDLen)
	}
}

func TestValidateReportsEveryKey(t *testing.T) {
	c := Default()
	c.Shards = 0
	c.Log.Level = "loud"
	c.Scanner.Lease = 0
	c.Targets.Deny = []string{"a.>.b"}
	err := c.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"shards:", "log.level:", "scanner.lease:", "targets.deny:"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
}

func TestUnknownFileKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	_ = os.WriteFile(path, []byte("shard: 4\n"), 0o600)
	if _, err := Load(Sources{Path: path}); err == nil || !strings.Contains(err.Error(), "shard") {
		t.Fatalf("want unknown key error, got %v", err)
	}
}

func TestBadEnvValue(t *testing.T) {
	if _, err := Load(Sources{Getenv: env(map[string]string{"DELAYD_SHARDS": "many"})}); err == nil {
		t.Fatal("want error for non-numeric shards")
	}
}

func TestRedacted(t *testing.T) {
	c := Default()
	c.Redis.Password = "hunter2"
	if r := c.Redacted(); r.Redis.Password == "hunter2" || c.Redis.Password != "hunter2" {
		t.Fatal("Redacted must hide the password in the copy only")
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://h:4222":                      "nats://h:4222",
		"nats://tok@h:4222":                  "nats://REDACTED@h:4222",
		"nats://u:p@ss@h:4222":               "nats://REDACTED@h:4222",
		"tls://u:p@h:1,nats://h2:2,tok@h3:3": "tls://REDACTED@h:1,nats://h2:2,REDACTED@h3:3",
		"redis://:pw@h:6379":                 "redis://REDACTED@h:6379",
		"u:pw@h:6379":                        "REDACTED@h:6379",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A nats.url is refused when the URL parser would not see its credentials
// where RedactURL hides them, and the refusal quotes none of them.
func TestValidateNATSURL(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"nats://h:4222", true},
		{"nats://tok@h:4222, tls://u:p%2Fq@h2:4222", true},
		{"tok@h:4222", true},
		{"nats://u:SECRET/x@h:4222", false},
		{"nats://SECRET?x@h:4222", false},
		{"h:4222,nats://u:SE#CRET@h:4222", false},
		{"nats://SECRET%zz@h:4222", false},
		{"nats://h:port", false},
	} {
		c := Default()
		c.NATS.URL = tc.url
		err := c.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok %v", tc.url, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "nats.url:") || strings.Contains(err.Error(), "SE")) {
			t.Errorf("%q: the error must name nats.url and no credentials: %v", tc.url, err)
		}
	}
}

// Limits that would let due times overflow, and the new hardening keys,
// are checked at validation.
func TestValidateBoundsTimeLimits(t *testing.T) {
	c := Default()
	c.Limits.MaxDelay = 2562047 * time.Hour
	c.Limits.MaxPast = 200 * 365 * 24 * time.Hour
	c.Limits.MaxPayload = -1
	c.Scanner.CheckInterval = time.Millisecond
	err := c.Validate()
	for _, key := range []string{"limits.max_delay:", "limits.max_past:", "limits.max_payload:", "scanner.check_interval:"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
	c = Default()
	c.Limits.MaxPast, c.Scanner.CheckInterval = 0, 0 // no limit, check off
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateStream(t *testing.T) {
	c := Default()
	if c.Intake.Stream.Retention != "limits" {
		t.Fatalf("intake.stream.retention defaults to %q, want limits", c.Intake.Stream.Retention)
	}
	c.Intake.Stream = Stream{Enabled: "yes", Name: "DELAYD.INTAKE", Retention: "interest", Replicas: 7, MaxAge: -time.Second,
		MaxBytes: -1, Pull: 0, PullBytes: -1, AckWait: time.Millisecond, RetryDelay: 0}
	err := c.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"enabled", "name", "retention", "replicas", "max_age", "max_bytes", "pull", "pull_bytes", "ack_wait", "retry_delay"} {
		if !strings.Contains(err.Error(), "intake.stream."+key+":") {
			t.Errorf("error does not name intake.stream.%s: %v", key, err)
		}
	}
	vars := map[string]string{"DELAYD_INTAKE_STREAM_ENABLED": "false", "DELAYD_INTAKE_STREAM_MAX_AGE": "1h", "DELAYD_INTAKE_STREAM_RETENTION": "workqueue"}
	c, err = Load(Sources{Getenv: env(vars), Environ: []string{"DELAYD_INTAKE_STREAM_ENABLED", "DELAYD_INTAKE_STREAM_MAX_AGE", "DELAYD_INTAKE_STREAM_RETENTION"}})
	if err != nil || c.StreamEnabled() || c.Intake.Stream.MaxAge != time.Hour || c.Intake.Stream.Retention != "workqueue" {
		t.Fatalf("env: %v %+v", err, c.Intake.Stream)
	}
}

// The retry and interest-check keys: defaults as docs/configuration.md
// gives them, and each bad value named by its key.
func TestValidateRetryKeys(t *testing.T) {
	d := Default()
	if d.Scanner.RetryBackoff != time.Second || d.Scanner.RetryBackoffMax != time.Minute ||
		d.Scanner.NoInterestRetryFor != 10*time.Minute || len(d.Targets.FireAndForget) != 0 {
		t.Fatalf("defaults %+v %+v", d.Scanner, d.Targets)
	}
	c := Default()
	c.Scanner.RetryBackoffMax = -time.Second
	c.Scanner.NoInterestRetryFor = -time.Second
	c.Targets.FireAndForget = []string{"a.>.b"}
	err := c.Validate()
	for _, key := range []string{"scanner.retry_backoff_max:", "scanner.no_interest_retry_for:", "targets.fire_and_forget:"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
	c = Default()
	c.Scanner.RetryBackoffMax = 0 // constant backoff
	c.Scanner.NoInterestRetryFor = 0
	c.Targets.FireAndForget = []string{"signals.>", "metrics.*.tick"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string // "" for valid
	}{
		{"default waits for nothing", func(*Config) {}, ""},
		{"one replica", func(c *Config) { c.Redis.WaitReplicas = 1 }, ""},
		{"local fsync alone", func(c *Config) { c.Redis.WaitLocalFsync = true }, ""},
		{"negative", func(c *Config) { c.Redis.WaitReplicas = -1 }, "redis.wait_replicas:"},
		{"no timeout", func(c *Config) { c.Redis.WaitReplicas = 1; c.Redis.WaitTimeout = 0 }, "redis.wait_timeout:"},
		{"a timeout the lease cannot hold", func(c *Config) {
			c.Redis.WaitReplicas = 1
			c.Scanner.Lease = 2 * time.Second
			c.Redis.WaitTimeout = time.Second
		}, "redis.wait_timeout:"},
		{"embedded", func(c *Config) { c.Redis.WaitReplicas = 1; c.Embedded = true }, "embedded emulation"},
		{"strict claims", func(c *Config) { c.Redis.WaitReplicas = 1; c.Redis.WaitClaims = "strict" }, ""},
		{"strict claims on the fsync alone", func(c *Config) { c.Redis.WaitLocalFsync = true; c.Redis.WaitClaims = "strict" }, ""},
		{"strict claims without a wait", func(c *Config) { c.Redis.WaitClaims = "strict" }, "redis.wait_claims: strict needs"},
		{"unknown claims mode", func(c *Config) { c.Redis.WaitReplicas = 1; c.Redis.WaitClaims = "Strict" }, "redis.wait_claims: must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.set(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}

// intake.dedupe_window is off at 0, else bounded: a tombstone per
// delivered id lives for the window, so 25h is refused, as is 1ms.
func TestValidateDedupeWindow(t *testing.T) {
	for _, tc := range []struct {
		w  time.Duration
		ok bool
	}{{0, true}, {time.Second, true}, {2 * time.Minute, true}, {24 * time.Hour, true},
		{time.Millisecond, false}, {25 * time.Hour, false}, {-time.Second, false}} {
		c := Default()
		c.Intake.DedupeWindow = tc.w
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "intake.dedupe_window:")) {
			t.Errorf("dedupe_window %s: %v, want ok %v", tc.w, err, tc.ok)
		}
	}
}

// intake.stream.name leaves room for the stream a migration creates,
// <name>_MIGRATING, within JetStream's 255 characters: 245 at most.
func TestValidateStreamNameLength(t *testing.T) {
	c := Default()
	c.Intake.Stream.Name = strings.Repeat("N", 245)
	if err := c.Validate(); err != nil {
		t.Fatalf("a name of 245: %v", err)
	}
	c.Intake.Stream.Name = strings.Repeat("N", 246)
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "intake.stream.name:") {
		t.Fatalf("a name of 246: %v", err)
	}
}

// limits.max_jitter has a default, reaches the envelope limits, and must be
// positive and bounded like max_delay.
func TestMaxJitter(t *testing.T) {
	c := Default()
	if c.Limits.MaxJitter != time.Hour || c.EnvelopeLimits().MaxJitter != time.Hour {
		t.Fatalf("limits.max_jitter defaults to %v (envelope %v), want 1h", c.Limits.MaxJitter, c.EnvelopeLimits().MaxJitter)
	}
	for _, v := range []time.Duration{0, -time.Second, 101 * 365 * 24 * time.Hour} {
		c.Limits.MaxJitter = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "limits.max_jitter:") {
			t.Errorf("limits.max_jitter %v: %v, want an error naming the key", v, err)
		}
	}
}
