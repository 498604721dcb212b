package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// startForFootprint starts the daemon binary with 16 shards and its admin
// server on a known port, returning the process and the readyz URL.
func startForFootprint(b *testing.B, bin string, e *daemontest.Env) (*exec.Cmd, string) {
	b.Helper()
	port := testutil.FreePort(b)
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "DELAYD_NATS_URL="+e.NATS.URL(), "DELAYD_REDIS_ADDRS="+e.Redis.Addr,
		"DELAYD_SHARDS=16", "DELAYD_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "DELAYD_UI_ADDR=127.0.0.1:0", "DELAYD_LOG_LEVEL=warn")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd, fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
}

// BenchmarkStartToReady measures from exec to /readyz answering 200,
// against reachable Redis and NATS.
func BenchmarkStartToReady(b *testing.B) {
	e := &daemontest.Env{Redis: testutil.StartRedis(b), NATS: testutil.StartNATS(b)}
	bin := delaydBinary(b)
	var total time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		cmd, url := startForFootprint(b, bin, e)
		for {
			if resp, err := http.Get(url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Since(start) > 10*time.Second {
				b.Fatal("not ready in 10 s")
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/start")
}

// BenchmarkIdleCPU measures the daemon's CPU use with 16 shards and nothing
// due, over 20 s, as a percentage of one core.
func BenchmarkIdleCPU(b *testing.B) {
	e := &daemontest.Env{Redis: testutil.StartRedis(b), NATS: testutil.StartNATS(b)}
	bin := delaydBinary(b)
	for i := 0; i < b.N; i++ {
		cmd, url := startForFootprint(b, bin, e)
		testutil.Wait(b, 10*time.Second, "/readyz answers 200", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
		time.Sleep(2 * time.Second) // past start-up work
		c0, t0 := cpuTicks(b, cmd.Process.Pid), time.Now()
		time.Sleep(20 * time.Second)
		c1, t1 := cpuTicks(b, cmd.Process.Pid), time.Now()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// /proc ticks are 1/100 s.
		b.ReportMetric(100*float64(c1-c0)/100/t1.Sub(t0).Seconds(), "%core")
	}
}

func cpuTicks(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
