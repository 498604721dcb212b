package store

import (
	"context"
	"testing"

	"github.com/delayd/delayd/internal/testutil"
)

// TestRedisCPUGrowsWithWork: the main thread's CPU is read, and grows
// while Redis works.
func TestRedisCPUGrowsWithWork(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	rdb := NewClient(Options{Addrs: []string{r.Addr}})
	defer rdb.Close()
	ctx := context.Background()
	before, err := RedisCPU(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	// A script that spins for a while: Redis' own CPU, not the test's.
	if err := rdb.Eval(ctx, "local n = 0 for i = 1, 3e7 do n = n + i end return 1", nil).Err(); err != nil {
		t.Fatal(err)
	}
	after, err := RedisCPU(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("Redis CPU went from %.3f to %.3f s across a busy script", before, after)
	}
}

func TestMainThreadCPU(t *testing.T) {
	t.Parallel()
	s, err := mainThreadCPU("# CPU\r\nused_cpu_sys:2.5\r\nused_cpu_user:4.0\r\nused_cpu_sys_main_thread:1.5\r\nused_cpu_user_main_thread:3.0\r\n")
	if err != nil || s != 4.5 {
		t.Fatalf("main thread: %v %v, want 4.5", s, err)
	}
	s, err = mainThreadCPU("used_cpu_sys:2.5\r\nused_cpu_user:4.0\r\n")
	if err != nil || s != 6.5 {
		t.Fatalf("no main thread fields: %v %v, want 6.5", s, err)
	}
	if _, err := mainThreadCPU("# CPU\r\n"); err == nil {
		t.Fatal("no CPU fields: no error")
	}
}
