package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, a replica and one sentinel watching them as
// "mymaster", all redis-server processes on loopback.
type Sentinel struct {
	Master, Replica *Redis
	Addr            string // the sentinel
	cmd             *exec.Cmd
}

// StartSentinel starts the three processes; the sentinel declares the
// master down after 1 s.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	m := StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	_, mport, _ := strings.Cut(m.Addr, ":")
	r := StartRedis(t, "--replicaof", "127.0.0.1", mport, "--appendonly", "yes", "--appendfsync", "always")
	s := &Sentinel{Master: m, Replica: r}
	port := FreePort(t)
	s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %s 1\n"+
		"sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n", port, dir, mport)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(RedisBinary(t), conf, "--sentinel")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	var err error
	if !Eventually(15*time.Second, func() bool {
		var addr []string
		addr, err = sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
		rep, _ := r.Client().Info(context.Background(), "replication").Result()
		return err == nil && len(addr) == 2 && strings.Contains(rep, "master_link_status:up")
	}) {
		t.Fatalf("sentinel not ready: %v", err)
	}
	return s
}

// MasterAddr is the master the sentinel currently names.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
	if err != nil {
		t.Fatal(err)
	}
	return addr[0] + ":" + addr[1]
}
