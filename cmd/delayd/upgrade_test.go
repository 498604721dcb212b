package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestReplayBesideThePreviousRelease runs this version's intake beside a
// scanner of the release before the format switch (built from git), as a
// rolling upgrade does. An envelope that died after 3 attempts on the old
// scanner and is replayed must be delivered as attempt 4. This version's
// replay used to write the attempts entry as "3/3", which the old release
// reads as 0: it delivered the replay as attempt 1. It has no form that
// keeps both the count and a fresh budget (a plain "3" makes it bury the
// envelope again at its first claim), so a replay is refused, changing
// nothing, while one of its daemons lives, and works once it has left.
func TestReplayBesideThePreviousRelease(t *testing.T) {
	t.Parallel()
	old := releaseBinary(t, previousRelease)
	bin := delaydBinary(t)
	r := testutil.StartRedis(t)
	n := testutil.StartNATS(t)
	common := []string{"DELAYD_TARGETS_JETSTREAM=up.>", "DELAYD_SCANNER_MAX_ATTEMPTS=3",
		"DELAYD_SCANNER_RETRY_BACKOFF=20ms"}
	oldScanner := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=scanner")...)
	testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=intake")...)

	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// No stream captures up.> yet: every JetStream publish fails, and the
	// old scanner counts three attempts, then buries the envelope.
	m, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "up.x", "Delayd-Delay", "0s", "Delayd-Id", "u1"), "p")
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	if e := m.Header.Get("Nats-Service-Error"); e != "" {
		t.Fatalf("schedule: %s", e)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	attempts := func() string {
		for s := range 4 {
			if v, err := rdb.HGet(context.Background(), fmt.Sprintf("{delayd:%d}:attempts", s), "u1").Result(); err == nil {
				return v
			}
		}
		return ""
	}
	dead := func() bool {
		for s := range 4 {
			if rdb.ZScore(context.Background(), fmt.Sprintf("{delayd:%d}:dead", s), "u1").Err() == nil {
				return true
			}
		}
		return false
	}
	if !testutil.Eventually(20*time.Second, dead) {
		t.Fatalf("u1 not dead after 20 s (attempts %q)", attempts())
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "UP", Subjects: []string{"up.>"}})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "DELAYD_NATS_URL" {
			return n.URL()
		}
		return ""
	}
	replay := func() error {
		out.Reset()
		errOut.Reset()
		return run(context.Background(), []string{"delayd", "dead", "replay", "u1"}, getenv, &out, &errOut)
	}
	err = replay()
	if err == nil || !bytes.Contains([]byte(err.Error()+errOut.String()), []byte("finish the rolling upgrade")) {
		t.Fatalf("replay beside the previous release's scanner: err %v, stdout %q, stderr %q; want it refused", err, out.String(), errOut.String())
	}
	if !dead() || attempts() != "3" {
		t.Fatalf("a refused replay changed u1: dead %v, attempts %q", dead(), attempts())
	}

	// The rollout finishes: the old scanner leaves, this version's takes
	// over, and the replay goes through.
	oldScanner.Stop()
	testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner")...)
	if !testutil.Eventually(10*time.Second, func() bool { err = replay(); return err == nil }) {
		t.Fatalf("replay once the previous release left: %v %s", err, errOut.String())
	}
	testutil.Wait(t, 20*time.Second, "the replayed envelope delivered", func() bool {
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs > 0
	})
	msg, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get("Delayd-Attempt"); got != "4" {
		t.Fatalf("replayed after 3 attempts, delivered by the previous release as attempt %s, want 4", got)
	}
}
