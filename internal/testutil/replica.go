package testutil

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a redis-server replicating master (--replicaof) and
// waits until the master counts it as an online replica that acknowledged
// everything (what WAIT counts). It speeds the master's replication up
// first, so the first sync does not wait 5 s for more replicas
// (FastReplication). extra are more config directives of the replica.
func StartReplica(t testing.TB, master *Redis, extra ...string) *Redis {
	t.Helper()
	FastReplication(t, master)
	host, port, _ := strings.Cut(master.Addr, ":")
	r := StartRedis(t, append([]string{"--replicaof", host, port}, extra...)...)
	WaitReplicas(t, master, 1, 10*time.Second)
	return r
}

// FastReplication makes master start a replica's sync at once (no
// diskless-sync delay) and ping its replicas every second, so the first
// acknowledged offset comes within a second.
func FastReplication(t testing.TB, master *Redis) {
	t.Helper()
	c := master.Client()
	for _, kv := range [][2]string{{"repl-diskless-sync-delay", "0"}, {"repl-ping-replica-period", "1"}} {
		if err := c.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("redis %s: config set %s: %v", master.Addr, kv[0], err)
		}
	}
}

// WaitReplicas waits until master counts n online replicas that have
// acknowledged all it wrote (what a WAIT then finds at once).
func WaitReplicas(t testing.TB, master *Redis, n int, d time.Duration) {
	t.Helper()
	start := time.Now()
	c := redis.NewClient(&redis.Options{Addr: master.Addr, TLSConfig: master.tls})
	defer c.Close()
	if Eventually(d, func() bool {
		if CaughtUpReplicas(master) >= n {
			return true
		}
		// INFO shows the offsets replicas acknowledged last, once a second;
		// with the master's own pings to its replicas, also once a second
		// here (FastReplication), the two can stay a ping apart for good
		// (a CI run waited 5 s at offsets 1023 and 1037, lag 0). After a
		// second of that, WAIT asks the online replicas for their offset
		// at once (REPLCONF GETACK), as the store's waits do; not sooner,
		// so a replica that has just synced settles first.
		if time.Since(start) > time.Second {
			if got, err := c.Do(context.Background(), "WAIT", n, 200).Int(); err == nil && got >= n {
				return true
			}
		}
		return false
	}) {
		return
	}
	info, _ := master.Client().Info(context.Background(), "replication").Result()
	t.Fatalf("redis %s: %d replicas caught up not reached in %s:\n%s", master.Addr, n, d, info)
}

// CaughtUpReplicas counts master's online replicas that have acknowledged
// all it wrote (0 when master does not answer).
func CaughtUpReplicas(master *Redis) int {
	c := redis.NewClient(&redis.Options{Addr: master.Addr, TLSConfig: master.tls})
	defer c.Close()
	info, _ := c.Info(context.Background(), "replication").Result()
	return caughtUp(info)
}

// caughtUp counts the online replicas in INFO replication whose
// acknowledged offset reached the master's.
func caughtUp(info string) int {
	var offset int64 = -1
	var acked []int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
			offset, _ = strconv.ParseInt(v, 10, 64)
		}
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			for _, kv := range strings.Split(line, ",") {
				if v, ok := strings.CutPrefix(kv, "offset="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					acked = append(acked, n)
				}
			}
		}
	}
	n := 0
	for _, a := range acked {
		if offset > 0 && a >= offset {
			n++
		}
	}
	return n
}
