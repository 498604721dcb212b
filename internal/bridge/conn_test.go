package bridge

import (
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/delayd/delayd/internal/testutil"
)

// A daemon whose NATS password is refused keeps retrying, so that fixing
// the credentials on the server brings it back: nats.go by default closes
// the connection for good after the same authorization error twice, and a
// daemon that neither connects nor exits is never restarted.
func TestConnectRetriesAfterAuthorizationErrors(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t, func(o *server.Options) { o.Username, o.Password = "alice", "right" })
	nc, err := Connect(n.URL(), "delayd-test", Auth{User: "alice", Password: "wrong"}, hclog.NewNullLogger(), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(time.Second) // several refused attempts (one every 250 ms)
	if nc.IsClosed() {
		t.Fatal("the connection gave up after authorization errors")
	}
	opts := n.Opts.Clone()
	opts.Password = "wrong" // the operator fixes the server side
	if err := n.Srv.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(10*time.Second, func() bool { return nc.IsConnected() || nc.IsClosed() }) || nc.IsClosed() {
		t.Fatalf("not connected 10 s after the credentials were fixed (closed: %v)", nc.IsClosed())
	}
}
