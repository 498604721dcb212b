package daemontest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/testutil"
)

// ClusterEnv is an Env whose NATS is node 0 of a cluster (Nodes).
type ClusterEnv struct {
	*Env
	Nodes []*testutil.NATS
}

// NewClusterEnv starts a 3-node NATS cluster with JetStream and one
// redis-server.
func NewClusterEnv(t testing.TB) *ClusterEnv {
	t.Helper()
	nodes := testutil.StartNATSCluster(t, 3)
	return &ClusterEnv{Env: &Env{T: t, Redis: testutil.StartRedis(t), NATS: nodes[0]}, Nodes: nodes}
}

// URLsFrom lists the cluster's URLs starting with node i.
func (e *ClusterEnv) URLsFrom(i int) string {
	urls := []string{e.Nodes[i].URL()}
	for j, n := range e.Nodes {
		if j != i {
			urls = append(urls, n.URL())
		}
	}
	return strings.Join(urls, ",")
}

// ConnTo connects to node i first, with the others to fail over to; the
// test's cleanup closes it.
func (e *ClusterEnv) ConnTo(i int) *nats.Conn {
	e.T.Helper()
	nc, err := nats.Connect(e.URLsFrom(i), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(nc.Close)
	return nc
}

// Node returns the node named name ("n0".."n2").
func (e *ClusterEnv) Node(name string) *testutil.NATS {
	for _, n := range e.Nodes {
		if n.Opts.ServerName == name {
			return n
		}
	}
	e.T.Fatalf("no node %q", name)
	return nil
}
