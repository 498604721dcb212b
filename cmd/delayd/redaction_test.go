package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/testutil"
)

// TestNoSecretInLogs runs whole daemons, and the bench, through run() with
// credentials in the NATS and Redis URLs, given in a config file, in the
// environment and as flags, on the happy path and on the error paths
// (wrong credentials, a NATS server that goes away and comes back, an
// unreachable Redis, URLs that do not parse), and fails if any byte of
// their output, JSON or text, or of the error main would print, carries a
// secret. The server's refusal must still be named.
func TestNoSecretInLogs(t *testing.T) {
	t.Parallel()
	const (
		token     = "tokSECRET1"
		user      = "usrSECRET2"
		pass      = "pwdSECRET3"
		wrongPass = "pwdSECRET4"
		wrongTok  = "tokSECRET5"
		redisPass = "rdsSECRET6"
		cutPass   = "cutSECRET7" // the URL parser ends the host at the "/" after it
		badEscape = "escSECRET8" // followed by an invalid %-escape
	)
	secrets := []string{token, user, pass, wrongPass, wrongTok, redisPass, cutPass, badEscape}

	tokNATS := testutil.StartNATS(t, func(o *server.Options) { o.Authorization = token })
	userNATS := testutil.StartNATS(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: user, Password: pass}}
	})
	r := testutil.StartRedis(t)
	if err := r.Client().ConfigSet(context.Background(), "requirepass", redisPass).Err(); err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://:" + redisPass + "@" + r.Addr
	deadRedis := fmt.Sprintf("redis://:%s@127.0.0.1:%d", redisPass, testutil.FreePort(t))
	creds := func(n *testutil.NATS, userinfo string) string {
		return strings.Replace(n.URL(), "nats://", "nats://"+userinfo+"@", 1)
	}
	listen := []string{"--set", "http.addr=127.0.0.1:0", "--set", "ui.addr=127.0.0.1:0"}
	file := filepath.Join(t.TempDir(), "delayd.yaml")
	yaml := fmt.Sprintf("nats:\n  url: %s\nredis:\n  addrs: [%q]\nlog:\n  json: true\nhttp:\n  addr: 127.0.0.1:0\nui:\n  addr: 127.0.0.1:0\n",
		creds(tokNATS, token), redisURL)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	// A step waits until its text is in the output, then runs then.
	type step struct {
		wait string
		then func()
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		steps   []step
		wantErr bool
		anyErr  bool // the daemon may stop on its own or be stopped
	}{
		{name: "config file, token, JSON, NATS goes away and comes back",
			args: []string{"run", "--config", file},
			steps: []step{
				{`"@message":"ready"`, tokNATS.Stop},
				{"NATS disconnected", tokNATS.Start},
				{"NATS reconnected", nil},
				{"NATS connected", nil},
				{"REDACTED@127.0.0.1", nil},
			}},
		{name: "environment, user and password, text",
			args: []string{"run"},
			env: map[string]string{"DELAYD_NATS_URL": creds(userNATS, user+":"+pass), "DELAYD_REDIS_ADDRS": redisURL,
				"DELAYD_HTTP_ADDR": "127.0.0.1:0", "DELAYD_UI_ADDR": "127.0.0.1:0"},
			steps: []step{{"delayd: ready", nil}, {"NATS connected", nil}}},
		{name: "flags, wrong password, unreachable Redis",
			args:   append([]string{"run", "--nats-url", creds(userNATS, user+":"+wrongPass), "--redis-addrs", deadRedis}, listen...),
			steps:  []step{{"Authorization Violation", nil}, {"Redis not reachable yet", nil}, {"NATS still not reachable", nil}, {"the NATS delivery connection is down", nil}},
			anyErr: true},
		{name: "flags, embedded",
			args:  append([]string{"run", "--embedded", "--nats-url", fmt.Sprintf("nats://%s@127.0.0.1:%d", token, testutil.FreePort(t))}, listen...),
			steps: []step{{"delayd: ready", nil}}},
		{name: "flags, URL cut inside the password",
			args:    append([]string{"run", "--nats-url", creds(userNATS, user+":"+cutPass+"/x"), "--redis-addrs", redisURL}, listen...),
			wantErr: true},
		{name: "bench, wrong token",
			args:    []string{"bench", "--nats-url", creds(tokNATS, wrongTok), "--redis-addrs", redisURL, "--count", "10", "--timeout", "2s"},
			steps:   []step{{"Authorization Violation", nil}},
			wantErr: true},
		{name: "bench, URL that does not parse",
			args:    []string{"bench", "--nats-url", creds(tokNATS, badEscape+"%zz"), "--count", "10", "--timeout", "2s"},
			wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			getenv := func(k string) string { return tc.env[k] }
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- run(ctx, append([]string{"delayd"}, tc.args...), getenv, &out, &out) }()
			var err error
			returned := false
		steps:
			for _, s := range tc.steps {
				for deadline := time.Now().Add(15 * time.Second); !strings.Contains(out.String(), s.wait); {
					if returned || time.Now().After(deadline) {
						t.Errorf("%q never in the output:\n%s", s.wait, out.String())
						break steps
					}
					select {
					case err = <-done:
						returned = true
						exitCode(err, &out) // what main prints
					case <-time.After(20 * time.Millisecond):
					}
				}
				if s.then != nil {
					s.then()
				}
			}
			if !returned {
				cancel()
				select {
				case err = <-done:
					exitCode(err, &out)
				case <-time.After(20 * time.Second):
					t.Fatalf("did not stop:\n%s", out.String())
				}
			}
			if !tc.anyErr && (err != nil) != tc.wantErr {
				t.Errorf("error %v, want an error: %v", err, tc.wantErr)
			}
			for _, s := range secrets {
				if strings.Contains(out.String(), s) {
					t.Errorf("%s is in the output:\n%s", s, out.String())
				}
			}
		})
	}
}

// TestNoSecretInConfigErrors: a secret key given a number, a list or a
// map in the config file stops `delayd run` and `delayd config` (and the
// other commands that read the file) with the key named and no part of
// the value in any output: nats.password: 987654321 once printed
// "987654321 is not a string".
func TestNoSecretInConfigErrors(t *testing.T) {
	t.Parallel()
	values := []struct {
		name, yaml string
		marks      []string
	}{
		{"number", "987654321", []string{"987654321"}},
		{"list", "[s3cretA, 11223344]", []string{"s3cretA", "11223344"}},
		{"map", "{s3cretK: s3cretV}", []string{"s3cretK", "s3cretV"}},
	}
	for _, key := range config.SecretKeys {
		group, field, _ := strings.Cut(key, ".")
		for _, v := range values {
			file := filepath.Join(t.TempDir(), "delayd.yaml")
			body := fmt.Sprintf("%s:\n  %s: %s\n", group, field, v.yaml)
			if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, cmd := range []string{"run", "config", "stats", "doctor"} {
				var out syncBuffer
				err := run(context.Background(), []string{"delayd", cmd, "--config", file}, func(string) string { return "" }, &out, &out)
				if code := exitCode(err, &out); code != 1 {
					t.Errorf("%s with %s: %s: exit %d, want 1:\n%s", cmd, key, v.name, code, out.String())
				}
				if !strings.Contains(out.String(), key+" (in ") {
					t.Errorf("%s with %s: %s: the key is not named:\n%s", cmd, key, v.name, out.String())
				}
				for _, m := range v.marks {
					if strings.Contains(out.String(), m) {
						t.Errorf("%s with %s: %s: %q of the value is in the output:\n%s", cmd, key, v.name, m, out.String())
					}
				}
			}
		}
	}
}

func TestConfigDumpRedactsSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DELAYD_REDIS_PASSWORD": "redis-pw-123",
		"DELAYD_NATS_TOKEN":     "nats-token-456",
		"DELAYD_NATS_URL":       "nats://user:url-pw-789@nats:4222",
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"delayd", "config"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"redis-pw-123", "nats-token-456", "url-pw-789"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("config dump shows %q:\n%s", secret, out.String())
		}
	}
	if !strings.Contains(out.String(), "REDACTED") {
		t.Errorf("config dump does not mark redactions:\n%s", out.String())
	}
}

// TestDoctorNoSecret: doctor, which reads Redis itself, names the address
// it could not use without the password in it, plain and --json, for a
// single Redis, Sentinel and Cluster addresses, a wrong password and an
// unreachable host. The address it names once carried the password.
func TestDoctorNoSecret(t *testing.T) {
	t.Parallel()
	const (
		pass  = "docSECRET1"
		wrong = "docSECRET2"
	)
	r := testutil.StartRedis(t)
	if err := r.Client().ConfigSet(context.Background(), "requirepass", pass).Err(); err != nil {
		t.Fatal(err)
	}
	dead := func() string { return fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)) }
	for _, tc := range []struct {
		name  string
		addrs string
		set   []string
	}{
		{name: "single, wrong password", addrs: "redis://:" + wrong + "@" + r.Addr},
		{name: "single, unreachable", addrs: "redis://:" + pass + "@" + dead()},
		{name: "sentinel, unreachable", addrs: "redis://:" + pass + "@" + dead() + ",redis://:" + pass + "@" + dead(),
			set: []string{"--set", "redis.master_name=mymaster"}},
		{name: "cluster, unreachable", addrs: "redis://:" + pass + "@" + dead() + ",redis://:" + pass + "@" + dead()},
		{name: "cluster of one, wrong password", addrs: "redis://user:" + wrong + "@" + r.Addr,
			set: []string{"--set", "redis.cluster=true"}},
	} {
		for _, asJSON := range []bool{false, true} {
			args := append([]string{"delayd", "doctor"}, tc.set...)
			if asJSON {
				args = append(args, "--json")
			}
			env := map[string]string{"DELAYD_REDIS_ADDRS": tc.addrs}
			var out syncBuffer
			err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &out)
			if code := exitCode(err, &out); code != 1 {
				t.Errorf("%s (json %v): exit %d, want 1:\n%s", tc.name, asJSON, code, out.String())
			}
			if !strings.Contains(out.String(), "cannot reach Redis at ") {
				t.Errorf("%s (json %v): the address is not named:\n%s", tc.name, asJSON, out.String())
			}
			for _, s := range []string{pass, wrong} {
				if strings.Contains(out.String(), s) {
					t.Errorf("%s (json %v): %s is in the output:\n%s", tc.name, asJSON, s, out.String())
				}
			}
		}
	}
}
