package systest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
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
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.once", "Delayd-Delay", "10ms", "Delayd-Id", "once"))
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.every", "Delayd-Every", "1h", "Delayd-Start",
		time.Now().Add(20*time.Millisecond).UTC().Format(time.RFC3339Nano), "Delayd-Id", "every"))
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "later.gone", "Delayd-Delay", "10ms", "Delayd-Id", "gone"))
	st := e.InspectStore(c)
	for _, id := range []string{"once", "every", "gone"} {
		if en := waitState(t, st, id, store.StateDead, 10*time.Second); en.Attempts != 2 {
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
	deadline := time.Now().Add(10 * time.Second)
	for daemontest.StreamMsgs(t, s) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
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
	deadline = time.Now().Add(5 * time.Second)
	for {
		m := scrape(t, c.HTTP.Addr)
		sum := m["delayd_envelopes_dead_total"] - m[`delayd_redeliveries_total{cause="replay"}`] - m["delayd_envelopes_purged_total"]
		if m["delayd_envelopes_dead_total"] == 3 && sum == m["delayd_dead_envelopes"] && sum == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead-set counters disagree: %v", m)
		}
		time.Sleep(50 * time.Millisecond)
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

// TestMixedVersionFleet: a daemon of the next version (simulated: it reads
// and writes a next stored format) beside one of this version. While both
// live, the fleet writes this version's format; with the older one gone,
// the next one's; an older daemon that comes back (a rollback) gives the
// newer values back untouched and uncounted, and the newer daemon
// delivers every one of them once, as attempt 1.
func TestMixedVersionFleet(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.HTTP.Addr = "" // several daemons side by side
	stopOld := e.StartDaemon(c)
	stopNew := e.StartDaemon(c, daemon.WithNewestFormat(3))
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "mixed.t")
	st := e.InspectStore(c)
	formats := func() map[int]int {
		t.Helper()
		n, err := st.Formats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Due once all 60 are sent and counted, with room for a loaded
	// machine: one due while the test still counts formats is gone.
	due := time.Now().Add(10 * time.Second)
	at := due.UTC().Format(time.RFC3339Nano)
	var ids []string
	send := func(prefix string, n int) {
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ids = append(ids, id)
			daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "mixed.t", "Delayd-At", at, "Delayd-Id", id))
		}
	}
	time.Sleep(c.Ownership.TTL) // both announced
	send("both", 20)
	if f := formats(); f[3] != 0 || f[2] != 20 {
		t.Fatalf("with an older daemon alive the fleet wrote %v, want format 2 only", f)
	}
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(c.Ownership.TTL) // the newer daemon sees it gone
	send("alone", 20)
	if f := formats(); f[3] != 20 {
		t.Fatalf("the newer daemon alone wrote %v, want 20 of format 3", f)
	}
	// A rollback: an older daemon joins, owns some shards, meets format 3.
	stopOld = e.StartDaemon(c)
	time.Sleep(c.Ownership.TTL)
	send("rollback", 20)
	if f := formats(); f[3] != 20 || f[2] != 40 {
		t.Fatalf("after the older daemon came back the fleet wrote %v, want format 2 again", f)
	}
	// Two seconds past the due time: the older daemon has met its shards'
	// format-3 values and given them back, never burying or counting them.
	time.Sleep(time.Until(due.Add(2 * time.Second)))
	for i := range 20 {
		en, err := st.Get(context.Background(), fmt.Sprintf("alone-%d", i))
		if err == nil && (en.State == store.StateDead || en.Attempts > 1) {
			t.Fatalf("a format-3 value with the older daemon: %+v", en)
		}
	}
	// The older daemon leaves: the newer one delivers the rest.
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	if n := got.WaitCount(len(ids), 20*time.Second); n < len(ids) {
		t.Fatalf("%d of %d delivered", n, len(ids))
	}
	if _, dups := got.Check(t, ids); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	for _, id := range ids {
		for _, d := range got.Get(id) {
			if d.Attempt != 1 {
				t.Fatalf("%s arrived as attempt %d, want 1 (a give-back is not an attempt)", id, d.Attempt)
			}
		}
	}
	_ = stopNew
}
