package config

import (
	"strings"
	"testing"
)

// TestSecureDefaults: a newcomer's default run exposes nothing private
// beyond loopback.
func TestSecureDefaults(t *testing.T) {
	c := Default()
	if !Loopback(c.UI.Addr) || c.UI.Addr != "127.0.0.1:9480" {
		t.Errorf("ui.addr default %q is not loopback 127.0.0.1:9480", c.UI.Addr)
	}
	if c.UI.ShowPayloads || c.UI.Insecure || c.UI.AllowActions {
		t.Error("show_payloads, insecure and allow_actions must default to false")
	}
	want := "Authorization,Cookie,Set-Cookie,Proxy-Authorization,X-Api-Key"
	if got := strings.Join(c.UI.RedactHeaders, ","); got != want {
		t.Errorf("ui.redact_headers default %s, want %s", got, want)
	}
	if len(c.Headers.AllowNATS) != 0 {
		t.Error("headers.allow_nats must default to empty")
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9480": true, "127.1.2.3:1": true, "[::1]:9480": true, "localhost:9480": true, "LOCALHOST:1": true,
		":9480": false, "0.0.0.0:9480": false, "[::]:9480": false, "10.0.0.5:9480": false,
		"delayd.internal:9480": false, "127.0.0.1": false, "": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestConsoleOnNetworkNeedsAuth: a console reachable from the network
// without authentication is a configuration error, unless ui.insecure.
func TestConsoleOnNetworkNeedsAuth(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		ok   bool
	}{
		{"all interfaces, no auth", func(c *Config) { c.UI.Addr = ":9480" }, false},
		{"pod address, no auth", func(c *Config) { c.UI.Addr = "10.1.2.3:9480" }, false},
		{"insecure on purpose", func(c *Config) { c.UI.Addr, c.UI.Insecure = ":9480", true }, true},
		{"bearer token", func(c *Config) { c.UI.Addr, c.UI.BearerToken = ":9480", "t" }, true},
		{"basic auth", func(c *Config) { c.UI.Addr, c.UI.BasicAuthUser, c.UI.BasicAuthPassword = ":9480", "u", "p" }, true},
		{"console off", func(c *Config) { c.UI.Addr, c.UI.Enabled = ":9480", false }, true},
		{"loopback", func(c *Config) { c.UI.Addr = "[::1]:9480" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.set(&c)
			err := c.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "ui.addr:") {
				t.Errorf("error does not name ui.addr: %v", err)
			}
		})
	}
}

func TestAllowNATSMustBeNATSHeaders(t *testing.T) {
	c := Default()
	c.Headers.AllowNATS = []string{"nats-ttl", "X-Other", "Nats-"}
	err := c.Validate()
	if err == nil || strings.Count(err.Error(), "headers.allow_nats:") != 2 {
		t.Fatalf("want two headers.allow_nats errors, got %v", err)
	}
}

func TestPolicyFromConfig(t *testing.T) {
	c := Default()
	c.Subject = "svc.delayd"
	c.Targets.Allow = []string{"$KV.orders.>", "orders.>"}
	c.Headers.AllowNATS = []string{"Nats-TTL"}
	p := c.Policy()
	if p.Check("svc.delayd.schedule") == nil || p.Check("$KV.orders.a") != nil || p.Check("$KV.other.a") == nil {
		t.Errorf("policy from config: %+v", p)
	}
}
