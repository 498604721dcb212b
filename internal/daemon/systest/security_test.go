package systest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// secureNATS starts a nats-server that requires TLS with client
// certificates and user/password, with per-user permissions: delayd may
// publish only to orders.> (and its wake-ups and inbox probe under
// delayd.internal.>), the app only to delayd.>. delayd subscribes to its
// inbox: without it, it would never prove its inbox, nor deliver.
func secureNATS(t *testing.T, certs testutil.Certs) *testutil.NATS {
	t.Helper()
	return testutil.StartNATS(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig = true, true, certs.ServerTLS(t)
		o.Users = []*server.User{
			{Username: "delayd", Password: "delayd-secret", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"orders.>", "delayd.internal.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"delayd.>", "$SRV.>", "_INBOX.>"}},
				Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
			}},
			{Username: "app", Password: "app-secret", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"delayd.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>", "orders.>", "payments.>"}},
			}},
		}
	})
}

func TestNATSAuthTLSAndPermissions(t *testing.T) {
	t.Parallel()
	certs := testutil.MakeCerts(t)
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: secureNATS(t, certs)}
	url := strings.Replace(e.NATS.URL(), "nats://", "tls://", 1)
	c := e.Config()
	c.NATS.URL = url
	c.NATS.User, c.NATS.Password = "delayd", "delayd-secret"
	c.NATS.TLS = config.TLS{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}
	c.Scanner.MaxAttempts = 2
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	var logs testutil.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})).Run(ctx)
	}()

	app, err := nats.Connect(url, nats.UserInfo("app", "app-secret"), nats.Secure(certs.ClientTLS(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	s := e.Sink(app, "orders.>")
	paid := e.Sink(app, "payments.>")
	if !testutil.Eventually(10*time.Second, func() bool {
		var rep *nats.Msg
		rep, err = daemontest.Schedule(app, "delayd", daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "100ms", "Delayd-Id", "ok-1"), "x")
		return err == nil && rep.Header.Get("Nats-Service-Error") == ""
	}) {
		t.Fatalf("schedule over TLS with auth: %v\n%s", err, logs.String())
	}
	if s.WaitCount(1, 5*time.Second) != 1 {
		t.Fatalf("not delivered over TLS with auth:\n%s", logs.String())
	}
	// delayd's own policy allows payments.>, its NATS user may not publish
	// there: the refusal must not count as a delivery.
	if _, err := daemontest.Schedule(app, "delayd", daemontest.Hdr("Delayd-Target", "payments.charge", "Delayd-Delay", "10ms", "Delayd-Id", "denied-1"), "x"); err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(10*time.Second, func() bool { return strings.Contains(logs.String(), "envelope moved to the dead set") }) {
		t.Fatalf("refused publish was not failed:\n%s", logs.String())
	}
	if paid.Count() != 0 {
		t.Fatal("a publish the server refused was delivered")
	}
	if strings.Contains(logs.String(), "delayd-secret") {
		t.Fatal("the NATS password appears in the log")
	}
	// A client without a certificate is refused by the server.
	if nc, err := nats.Connect(url, nats.UserInfo("app", "app-secret"), nats.RootCAs(certs.CA)); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNATSTokenAndNKey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "delayd.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		server func(*server.Options)
		set    func(*config.Config)
		client nats.Option
	}{
		{"token", func(o *server.Options) { o.Authorization = "s3cret-token" },
			func(c *config.Config) { c.NATS.Token = "s3cret-token" }, nats.Token("s3cret-token")},
		{"nkey", func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} },
			func(c *config.Config) { c.NATS.NKeySeedFile = seedFile }, mustNkey(t, seedFile)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, tc.server)}
			c := e.Config()
			tc.set(&c)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- daemon.New(c, hclog.NewNullLogger()).Run(ctx) }()
			app, err := nats.Connect(e.NATS.URL(), tc.client)
			if err != nil {
				t.Fatal(err)
			}
			defer app.Close()
			s := e.Sink(app, "t.>")
			daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "t.x", "Delayd-Delay", "10ms", "Delayd-Id", "a"))
			if s.WaitCount(1, 5*time.Second) != 1 {
				t.Fatal("not delivered")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mustNkey(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestRedisACLAndTLS runs delayd against a TLS-only redis-server as the ACL
// user of docs/security.md (the line read from the file), which may only
// touch delayd's own keys.
func TestRedisACLAndTLS(t *testing.T) {
	t.Parallel()
	certs := testutil.MakeCerts(t)
	r := testutil.StartRedisTLS(t, certs)
	admin := r.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, docsACL(t, "redis-secret")...).Err(); err != nil {
		t.Fatal(err)
	}
	e := &daemontest.Env{T: t, Redis: r, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.Addrs = []string{"rediss://" + r.Addr}
	c.Redis.Username, c.Redis.Password = "delayd", "redis-secret"
	c.Redis.TLS = config.TLS{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}
	var logs testutil.Buffer
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})).Run(dctx)
	}()
	e.WaitService(c.Subject)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "acl.>")
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "acl.x", "Delayd-Delay", "50ms", "Delayd-Id", "r1"), "x")
	if err != nil || rep.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("schedule: %v %v\n%s", err, rep.Header, logs.String())
	}
	if s.WaitCount(1, 5*time.Second) != 1 {
		t.Fatalf("not delivered through TLS Redis with an ACL user:\n%s", logs.String())
	}
	// The ACL really restricts: the same user cannot touch other keys.
	if err := admin.Set(ctx, "other:key", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "DRYRUN", "delayd", "GET", "other:key").Err(); err == nil {
		// DRYRUN answers OK or an error string; check the answer text.
		v, _ := admin.Do(ctx, "ACL", "DRYRUN", "delayd", "GET", "other:key").Text()
		if v == "OK" {
			t.Fatal("ACL user may read keys outside delayd's namespace")
		}
	}
	if strings.Contains(logs.String(), "redis-secret") {
		t.Fatal("the Redis password appears in the log")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestNATSCredsFile runs delayd with a JWT user credentials file against a
// nats-server in operator mode.
func TestNATSCredsFile(t *testing.T) {
	t.Parallel()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ac := jwt.NewAccountClaims(apub)
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	creds := func(name string) string {
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.IssuerAccount = apub
		ujwt, err := uc.Encode(akp)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := ukp.Seed()
		b, err := jwt.FormatUserConfig(ujwt, seed)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), name+".creds")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{oc}
		o.AccountResolver = resolver
		o.JetStream = false
	})}
	c := e.Config()
	c.NATS.CredsFile = creds("delayd")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.New(c, hclog.NewNullLogger()).Run(ctx) }()
	app, err := nats.Connect(e.NATS.URL(), nats.UserCredentials(creds("app")))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	s := e.Sink(app, "creds.>")
	daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "creds.x", "Delayd-Delay", "10ms"))
	if s.WaitCount(1, 5*time.Second) != 1 {
		t.Fatal("not delivered")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
