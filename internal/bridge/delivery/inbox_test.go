package delivery

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/testutil"
)

// proven waits until p has proven it receives on its inbox.
func proven(t testing.TB, p *Publisher) {
	t.Helper()
	if !testutil.Eventually(10*time.Second, p.Connected) {
		t.Fatalf("the publisher never proved its inbox: %v", p.Down())
	}
}

// A publisher whose NATS user may not subscribe to its inbox cannot hear
// that a delivery reached no one: it is not Connected (the scanner claims
// nothing, the daemon holds no shard), says why with the server's
// refusal, and sends nothing. Once the permission is granted (a config
// reload), it subscribes again, proves its inbox and delivers, with the
// interest check on. After a reconnect it proves the inbox again.
func TestInboxCheck(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t, func(o *server.Options) { o.Users = inboxUsers(false) })
	ref := bridge.NewRefusals()
	nc, err := bridge.Connect(n.URL(), "t", bridge.Auth{User: "d", Password: "p", InboxPrefix: "_INBOX_d"}, hclog.NewNullLogger(), nil, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := NewPublisher(nc, ref, PublisherOptions{InboxProbe: "delayd.internal.probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var down error
	if !testutil.Eventually(10*time.Second, func() bool {
		down = p.Down()
		return down != nil && strings.Contains(down.Error(), "Permissions Violation for Subscription to")
	}) {
		t.Fatalf("Down does not give the refused subscription: %v", down)
	}
	if p.Connected() {
		t.Fatal("Connected while the inbox is refused")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Publish(ctx, deliveries("t.nobody"))[0]; !errors.Is(err, scanner.ErrUnreachable) {
		t.Fatalf("a delivery with the inbox refused: %v, want unreachable (nothing sent)", err)
	}

	// The operator grants the subscription.
	opts := n.Opts.Clone()
	opts.Users = inboxUsers(true)
	if err := n.Srv.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	n.Opts = opts
	proven(t, p)
	if err := p.Down(); err != nil {
		t.Fatalf("Down once proven: %v", err)
	}
	if err := p.Publish(ctx, deliveries("t.nobody"))[0]; !errors.Is(err, scanner.ErrNoInterest) {
		t.Fatalf("a delivery nobody hears: %v, want no interest", err)
	}

	// A restart of the server: proven again after the reconnect.
	n.Stop()
	testutil.Wait(t, 10*time.Second, "the connection notices the server stopped", func() bool { return !nc.IsConnected() })
	if p.Connected() {
		t.Fatal("Connected while NATS is down")
	}
	n.Start()
	proven(t, p)
	if err := p.Publish(ctx, deliveries("t.nobody"))[0]; !errors.Is(err, scanner.ErrNoInterest) {
		t.Fatalf("after the reconnect, a delivery nobody hears: %v, want no interest", err)
	}
}

// A config reload that takes the inbox subscription away (the server drops
// it and says so) makes the publisher unproven again: it sends nothing
// whose answer could not come back, and says why. Granted back, it
// subscribes again and delivers.
func TestInboxRevokedByReload(t *testing.T) {
	t.Parallel()
	p, reload := inboxPublisher(t, true)
	proven(t, p)
	reload(false)
	testutil.Wait(t, 10*time.Second, "not Connected once a reload took the inbox subscription away", func() bool { return !p.Connected() })
	if err := p.Down(); err == nil || !strings.Contains(err.Error(), "Subscription to") {
		t.Errorf("Down does not say the inbox subscription was refused: %v", err)
	}
	reload(true)
	proven(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Publish(ctx, deliveries("t.nobody"))[0]; !errors.Is(err, scanner.ErrNoInterest) {
		t.Fatalf("granted back, a delivery nobody hears: %v, want no interest", err)
	}
}

// inboxUsers is a NATS user "d" with docs/security.md's publish rights
// (targets and the internal subjects only: neither its inbox nor
// $JS.API.INFO), allowed its inbox _INBOX_d.> or not.
func inboxUsers(inbox bool) []*server.User {
	sub := []string{"delayd.>"}
	if inbox {
		sub = append(sub, "_INBOX_d.>")
	}
	return []*server.User{{Username: "d", Password: "p", Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"t.>", "delayd.internal.>"}},
		Subscribe: &server.SubjectPermission{Allow: sub},
	}}}
}

// inboxPublisher starts a NATS server with inboxUsers(inbox) and a
// publisher connected as "d"; reload grants or takes the inbox.
func inboxPublisher(t *testing.T, inbox bool) (p *Publisher, reload func(inbox bool)) {
	t.Helper()
	n := testutil.StartNATS(t, func(o *server.Options) { o.Users = inboxUsers(inbox) })
	ref := bridge.NewRefusals()
	nc, err := bridge.Connect(n.URL(), "t", bridge.Auth{User: "d", Password: "p", InboxPrefix: "_INBOX_d"}, hclog.NewNullLogger(), nil, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p, err = NewPublisher(nc, ref, PublisherOptions{InboxProbe: "delayd.internal.probe"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, func(inbox bool) {
		opts := n.Opts.Clone()
		opts.Users = inboxUsers(inbox)
		if err := n.Srv.ReloadOptions(opts); err != nil {
			t.Fatal(err)
		}
		n.Opts = opts
	}
}
