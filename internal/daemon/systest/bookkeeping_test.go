package systest

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// TestReplayCarriesTheNextAttempt: an envelope (and a series' occurrence)
// dies after 2 attempts at a JetStream target without a stream, is replayed
// once the stream exists, and arrives as attempt 3: attempts only go up.
// The dead-set counters agree with the dead set after deaths, a replay and
// a purge.
func TestReplayCarriesTheNextAttempt(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.MaxAttempts = 2
	c.HTTP.SampleInterval = 50 * time.Millisecond
	c.Targets.JetStream = []string{"later.>"}
	e.StartDaemon(c)
	// Serving is not delivering: until the inbox is proven and the shards
	// are held, tries are outages, which count no attempt.
	e.WaitReady(c)
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.once", "Delayd-Delay", "10ms", "Delayd-Id", "once"))
	// A Start already past when the request is stored moves the first
	// occurrence to Start + 1h (protocol.md): 1 s of margin, not 20 ms,
	// which a CI run under load overran.
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.every", "Delayd-Every", "1h", "Delayd-Start",
		time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano), "Delayd-Id", "every"))
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.gone", "Delayd-Delay", "10ms", "Delayd-Id", "gone"))
	st := e.InspectStore(c)
	for _, id := range []string{"once", "every", "gone"} {
		if en := waitState(t, st, id, store.StateDead, 20*time.Second); en.Attempts != 2 {
			t.Fatalf("%s dead after %d attempts, want 2", id, en.Attempts)
		}
	}
	s := e.Stream("LATER", "later.>")
	for verb, ids := range map[string]string{"replay": `["once","every"]`, "purge": `["gone"]`} {
		req := nats.NewMsg("delayd.admin." + verb)
		req.Data = []byte(`{"ids":` + ids + `}`)
		if _, err := nc.RequestMsg(req, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(10*time.Second, func() bool { return daemontest.StreamMsgs(t, s) >= 2 })
	for _, subject := range []string{"later.once", "later.every"} {
		m, err := s.GetLastMsgForSubject(context.Background(), subject)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if a := m.Header.Get("Delayd-Attempt"); a != "3" {
			t.Errorf("%s arrived as attempt %q after its replay, want 3", subject, a)
		}
	}
	// The series' next occurrence starts its attempts afresh.
	if en := waitState(t, st, "every", store.StatePending, 5*time.Second); en.Attempts != 0 || en.Occurrence != 2 {
		t.Fatalf("the series after its replayed occurrence: %+v", en)
	}
	// dead_total (3) - replays (2) - purges (1) = the dead set (0).
	var m map[string]float64
	if !testutil.Eventually(5*time.Second, func() bool {
		m = scrape(t, c.HTTP.Addr)
		sum := m["delayd_envelopes_dead_total"] - m[`delayd_redeliveries_total{cause="replay"}`] - m["delayd_envelopes_purged_total"]
		return m["delayd_envelopes_dead_total"] == 3 && sum == m["delayd_dead_envelopes"] && sum == 0
	}) {
		t.Fatalf("dead-set counters disagree: %v", m)
	}
}

// scrape reads the daemon's metrics without labels, and with labels as
// name{labels}.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err == nil {
			out[name] = f
		}
	}
	return out
}
