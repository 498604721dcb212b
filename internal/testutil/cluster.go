package testutil

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a real Redis Cluster of redis-server processes on loopback:
// three masters, each with one replica.
type Cluster struct {
	Nodes []*Redis
}

// StartRedisCluster starts six nodes and joins them with
// `redis-cli --cluster create --cluster-replicas 1`. A node timeout of 1 s
// lets a replica take over quickly when its master dies.
func StartRedisCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found: %v", err)
	}
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for range 6 {
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no")
		c.Nodes = append(c.Nodes, n)
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(t, 30*time.Second)
	return c
}

// Addrs are the addresses of every node.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// WaitOK waits until every live node reports cluster_state:ok.
func (c *Cluster) WaitOK(t testing.TB, d time.Duration) {
	t.Helper()
	Wait(t, d, "every live node of the cluster says cluster_state:ok", func() bool {
		for _, n := range c.Nodes {
			if n.cmd == nil {
				continue
			}
			info, err := n.Client().ClusterInfo(context.Background()).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
}

// Client is a cluster client for inspection.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// MasterOf returns the node serving slot as master.
func (c *Cluster) MasterOf(t testing.TB, slot int) *Redis {
	t.Helper()
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		shards, err := n.Client().ClusterShards(context.Background()).Result()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			if !servesSlot(sh, slot) {
				continue
			}
			for _, node := range sh.Nodes {
				if node.Role != "master" {
					continue
				}
				port := node.Port
				if port == 0 {
					port = node.TLSPort
				}
				addr := net.JoinHostPort(node.IP, strconv.FormatInt(port, 10))
				for _, m := range c.Nodes {
					if m.Addr == addr {
						return m
					}
				}
			}
		}
	}
	t.Fatalf("no master for slot %d", slot)
	return nil
}

// servesSlot reports whether the cluster shard sh holds slot.
func servesSlot(sh redis.ClusterShard, slot int) bool {
	for _, r := range sh.Slots {
		if int64(slot) >= r.Start && int64(slot) <= r.End {
			return true
		}
	}
	return false
}

// NodeID is the cluster id of n.
func NodeID(t testing.TB, n *Redis) string {
	t.Helper()
	id, err := n.Client().Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// MigrateSlot moves one slot, with its keys, from its master to dst, the
// way redis-cli --cluster reshard does: IMPORTING/MIGRATING, MIGRATE the
// keys in batches, then assign the slot on every master. Clients meanwhile
// see ASK and MOVED redirections.
func (c *Cluster) MigrateSlot(t testing.TB, slot int, dst *Redis) {
	t.Helper()
	ctx := context.Background()
	src := c.MasterOf(t, slot)
	if src == dst {
		return
	}
	srcID, dstID := NodeID(t, src), NodeID(t, dst)
	s, d := src.Client(), dst.Client()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("migrate slot %d: %v", slot, err)
		}
	}
	must(d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	host, port, _ := strings.Cut(dst.Addr, ":")
	for {
		keys, err := s.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(s.Do(ctx, args...).Err())
	}
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		if role, _ := n.Client().Do(ctx, "ROLE").Slice(); len(role) > 0 && role[0] == "master" {
			must(n.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
		}
	}
}
