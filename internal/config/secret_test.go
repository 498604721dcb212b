package config

import (
	"fmt"
	"strings"
	"testing"
)

// secretValues are YAML values of the wrong type for a string key, each
// carrying the marks that must never reach an error: a number, a float,
// a list, a map (flow and block), a nested map and a list of maps.
var secretValues = []struct {
	name string
	yaml string // the value, after "key: "
	show []string
}{
	{"number", "987654321", []string{"987654321"}},
	{"float", "98765.4321", []string{"98765"}},
	{"bool-looking", "yes", nil}, // YAML 1.1 would say true; a string here
	{"list", "[s3cretA, 11223344]", []string{"s3cretA", "11223344"}},
	{"map", "{s3cretK: s3cretV}", []string{"s3cretK", "s3cretV"}},
	{"map without a value", "{s3cretBare}", []string{"s3cretBare"}},
	{"nested map", "{s3cretN: {s3cretM: 55667788}}", []string{"s3cretN", "s3cretM", "55667788"}},
	{"list of maps", "[{s3cretL: s3cretW}]", []string{"s3cretL", "s3cretW"}},
}

// yamlFor writes key (dotted) with value as a block-nested YAML document.
func yamlFor(key, value string) string {
	parts := strings.Split(key, ".")
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i < len(parts)-1 {
			b.WriteString("\n")
		}
	}
	b.WriteString(" " + value + "\n")
	return b.String()
}

// TestSecretNeverInErrors: a secret key given a value of the wrong type
// (an unquoted number, a list, a map) is refused with its key named and
// without any part of the value: nats.password: 987654321 once printed
// "987654321 is not a string".
func TestSecretNeverInErrors(t *testing.T) {
	for _, key := range SecretKeys {
		for _, v := range secretValues {
			t.Run(key+"/"+v.name, func(t *testing.T) {
				_, err := Load(Sources{Path: writeYAML(t, yamlFor(key, v.yaml))})
				if len(v.show) == 0 {
					return // loads as a string; only the type errors matter
				}
				if err == nil {
					t.Fatalf("%s: %s was accepted", key, v.yaml)
				}
				msg := err.Error()
				if !strings.Contains(msg, key+" (in ") {
					t.Errorf("error does not name %s: %v", key, msg)
				}
				for _, s := range v.show {
					if strings.Contains(msg, s) {
						t.Errorf("error carries %q of the value: %v", s, msg)
					}
				}
			})
		}
	}
}

// TestSecretKeysRedacted: every secret key is hidden by Redacted, so the
// list the errors use and the list `delayd config` uses are one.
func TestSecretKeysRedacted(t *testing.T) {
	flags := map[string]string{}
	for i, key := range SecretKeys {
		flags[key] = fmt.Sprintf("sEcReT%d", i)
	}
	flags["ui.basic_auth_user"] = "u"
	flags["nats.user"] = "u"
	delete(flags, "nats.token") // one of user/password and token
	c, err := Load(Sources{Flags: flags})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for key, v := range flags {
		if strings.HasPrefix(v, "sEcReT") && strings.Contains(string(b), v) {
			t.Errorf("%s not redacted:\n%s", key, b)
		}
	}
	c.NATS.Token, c.NATS.User, c.NATS.Password = "sEcReTtok", "", ""
	if b, _ := c.YAML(); strings.Contains(string(b), "sEcReTtok") {
		t.Errorf("nats.token not redacted:\n%s", b)
	}
}

// TestSecretRedactedRefused: what `delayd config` prints for a secret (a
// secret key, or the credentials of a URL) does not load as one. A daemon
// started from that output once authenticated with the word REDACTED and
// retried WRONGPASS forever; now the load fails, naming the key and where
// the real secret goes.
func TestSecretRedactedRefused(t *testing.T) {
	secrets := map[string]map[string]string{
		"nats.url":    {"nats.url": "nats://u:sEcReT@h:4222"},
		"redis.addrs": {"redis.addrs": "redis://:sEcReT@h:6379,h2:6379"},
	}
	for _, key := range SecretKeys {
		secrets[key] = map[string]string{key: "sEcReT"}
	}
	secrets["ui.basic_auth_password"]["ui.basic_auth_user"] = "u"
	for key, flags := range secrets {
		t.Run(key, func(t *testing.T) {
			c, err := Load(Sources{Flags: flags})
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.YAML()
			if err != nil {
				t.Fatal(err)
			}
			_, err = Load(Sources{Path: writeYAML(t, string(b))})
			if err == nil {
				t.Fatalf("the output of delayd config loads with %s REDACTED:\n%s", key, b)
			}
			for _, want := range []string{key + ":", "REDACTED", EnvName(key)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
		})
	}
	// A secret that merely contains the word is a secret.
	if _, err := Load(Sources{Flags: map[string]string{"redis.password": "notREDACTEDatall", "redis.addrs": "redis://REDACTEDx:pw@h:6379"}}); err != nil {
		t.Errorf("a secret containing REDACTED refused: %v", err)
	}
}
