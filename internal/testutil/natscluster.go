package testutil

import (
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATSCluster starts n nats-servers in-process, routed into one
// cluster with JetStream (each node its own store dir), as production runs
// NATS, and waits until JetStream has a meta leader. Each node can be
// stopped and started again on its ports.
func StartNATSCluster(t testing.TB, n int) []*NATS {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = FreePort(t)
	}
	nodes := make([]*NATS, n)
	for i := range nodes {
		var routes []*url.URL
		for j, p := range ports {
			if j != i {
				routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
			}
		}
		o := func(o *server.Options) {
			o.ServerName = fmt.Sprintf("n%d", i)
			o.Cluster = server.ClusterOpts{Name: "delayd-test", Host: "127.0.0.1", Port: ports[i]}
			o.Routes = routes
		}
		// Started together: a node waits for its routes only as long as
		// JetStream needs a quorum, which the later nodes bring.
		nodes[i] = startNATSNoWait(t, o)
	}
	for _, nd := range nodes {
		nd.Start()
	}
	Wait(t, 20*time.Second, "a JetStream meta leader in the NATS cluster", func() bool {
		return slices.ContainsFunc(nodes, func(nd *NATS) bool { return nd.Srv != nil && nd.Srv.JetStreamIsLeader() })
	})
	return nodes
}

// startNATSNoWait configures a node like StartNATS without starting it.
func startNATSNoWait(t testing.TB, opts ...func(*server.Options)) *NATS {
	n := newNATS(t)
	for _, o := range opts {
		o(n.Opts)
	}
	t.Cleanup(n.Stop)
	return n
}
