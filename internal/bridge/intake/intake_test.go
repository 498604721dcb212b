package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// The store's failures as it wraps them.
var (
	errNotWritten = fmt.Errorf("store: schedule: %w", errors.Join(store.ErrNotWritten, syscall.ECONNREFUSED))
	errUnknown    = fmt.Errorf("store: schedule: %w", errors.Join(store.ErrOutcomeUnknown, context.DeadlineExceeded))
	errShortWait  = fmt.Errorf("store: schedule: %w: 0 of 1 replicas within 100ms", store.ErrNotReplicated)
)

// intakeStore is a fake of the intake's Store: Schedule answers each item
// by its envelope's target, Cancel by id.
type intakeStore struct {
	mu    sync.Mutex
	seen  []string      // ids Schedule was given
	block chan struct{} // if set, Schedule waits for it to close...
	in    chan string   // ...after reporting each id here
	// slowShard, if set, is how long Shard takes: what runs after it in
	// a flush (the wake-up, the count, the reply) is then seen late.
	slowShard time.Duration
}

func (f *intakeStore) Shard(id string) int {
	time.Sleep(f.slowShard)
	return len(id) % 4
}

func (f *intakeStore) Schedule(_ context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := make([]store.Scheduled, len(items)), make([]error, len(items))
	for i, it := range items {
		f.mu.Lock()
		f.seen = append(f.seen, it.ID)
		f.mu.Unlock()
		if f.in != nil {
			f.in <- it.ID
		}
		e, err := envelope.Decode(it.Data)
		if err != nil {
			panic(err)
		}
		due[i] = store.Scheduled{Kind: store.Stored, DueMs: 1_800_000_000_123}
		switch e.Target {
		case "t.notwritten":
			due[i], errs[i] = store.Scheduled{}, errNotWritten
		case "t.unknown":
			due[i], errs[i] = store.Scheduled{}, errUnknown
		case "t.notreplicated":
			errs[i] = errShortWait
		}
	}
	if f.block != nil {
		<-f.block
	}
	return due, errs
}

func (f *intakeStore) Cancel(_ context.Context, id string) (store.Cancelled, error) {
	switch id {
	case "there":
		return store.Cancelled{Existed: true, InFlight: true}, nil
	case "gone":
		return store.Cancelled{}, nil
	case "down":
		return store.Cancelled{}, errNotWritten
	case "timeout":
		return store.Cancelled{}, errUnknown
	}
	panic("unexpected cancel of " + id)
}

func (f *intakeStore) saw(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.seen {
		if s == id {
			return true
		}
	}
	return false
}

// noInspector serves no operator request; the intake binds its replay and
// purge when it starts.
type noInspector struct{ Inspector }

func (noInspector) Replay(context.Context, []string) (int, error) { return 0, errors.New("no store") }
func (noInspector) Purge(context.Context, []string) (int, error)  { return 0, errors.New("no store") }

// wakes records the intake's wake-ups, in order.
type wakes struct {
	mu sync.Mutex
	at [][2]int64 // shard, due time
}

func (w *wakes) Wake(shard int, dueMs int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at = append(w.at, [2]int64{int64(shard), dueMs})
}

// since returns the wake-ups after the first n.
func (w *wakes) since(n int) [][2]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([][2]int64(nil), w.at[min(n, len(w.at)):]...)
}

// intakeCounts records what the intake counted.
type intakeCounts struct {
	nopIntakeObserver
	mu        sync.Mutex
	received  map[int]int
	cancelled map[string]int
}

func (o *intakeCounts) Received(code int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.received == nil {
		o.received = map[int]int{}
	}
	o.received[code]++
}

func (o *intakeCounts) Cancelled(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cancelled == nil {
		o.cancelled = map[string]int{}
	}
	o.cancelled[result]++
}

func (o *intakeCounts) counts() (map[int]int, map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, c := map[int]int{}, map[string]int{}
	for k, v := range o.received {
		r[k] = v
	}
	for k, v := range o.cancelled {
		c[k] = v
	}
	return r, c
}

// intakeEnv is an intake over a fake store on an in-process nats-server,
// and a client connection to it.
type intakeEnv struct {
	st     *intakeStore
	wakes  *wakes
	obs    *intakeCounts
	intake *Intake
	nc     *nats.Conn // the client's
}

func startIntake(t *testing.T, st *intakeStore, mod ...func(*IntakeOptions)) *intakeEnv {
	t.Helper()
	return startIntakeWith(t, st, noInspector{}, mod...)
}

// startIntakeWith is startIntake whose operator endpoints read insp.
func startIntakeWith(t *testing.T, st *intakeStore, insp Inspector, mod ...func(*IntakeOptions)) *intakeEnv {
	t.Helper()
	return startIntakeOn(t, testutil.StartNATS(t), st, insp, mod...)
}

// startIntakeOn is startIntakeWith on the NATS server n.
func startIntakeOn(t *testing.T, n *testutil.NATS, st *intakeStore, insp Inspector, mod ...func(*IntakeOptions)) *intakeEnv {
	t.Helper()
	opt := IntakeOptions{Options: Options{Subject: "delayd", Batch: 16, storeTimeout: 5 * time.Second, Policy: envelope.Policy{Prefix: "delayd"}, Limits: envelope.Limits{MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: time.Hour}},
		Version: "0.0.0-test"}
	for _, m := range mod {
		m(&opt)
	}
	inc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	e := &intakeEnv{st: st, wakes: &wakes{}, obs: &intakeCounts{}}
	e.intake = NewIntake(inc, st, insp, e.wakes, e.obs, opt, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.intake.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("intake: %v", err)
		}
	})
	if e.nc, err = nats.Connect(n.URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	for end := time.Now().Add(10 * time.Second); ; {
		if _, err := e.nc.Request("$SRV.PING.delayd", nil, time.Second); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the intake service did not answer pings within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return e
}

// request sends a request and returns the reply.
func (e *intakeEnv) request(t *testing.T, subject string, h nats.Header) *nats.Msg {
	t.Helper()
	m, err := e.nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: []byte("payload")}, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	return m
}

func schedule(target, id string) nats.Header {
	h := nats.Header{envelope.HeaderTarget: {target}, envelope.HeaderDelay: {"1m"}}
	if id != "" {
		h.Set(envelope.HeaderID, id)
	}
	return h
}

// errorCode is the reply's NATS micro error code, "" for a success.
func errorCode(m *nats.Msg) string { return m.Header.Get(micro.ErrorCodeHeader) }

// How a schedule's store outcome is answered: stored, with its id and due
// time, and its shard woken; 503 when the store wrote nothing; 504 with
// the id (the one delayd made, when the request had none) when the write
// may have happened, so a retry with that id replaces it; and a write the
// replicas did not confirm answered 504 but woken, since it is on the
// master and due there.
func TestScheduleStoreOutcomes(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{})
	const due = int64(1_800_000_000_123)

	m := e.request(t, "delayd.schedule", schedule("t.ok", "a1"))
	var ok client.Scheduled
	if err := json.Unmarshal(m.Data, &ok); err != nil || errorCode(m) != "" {
		t.Fatalf("stored: reply %q %v (%v)", m.Data, m.Header, err)
	}
	if ok.ID != "a1" || !ok.DeliverAt.Equal(time.UnixMilli(due)) {
		t.Errorf("stored: reply %+v, want id a1 due %s", ok, time.UnixMilli(due).UTC())
	}
	if got, want := e.wakes.since(0), [][2]int64{{int64(e.st.Shard("a1")), due}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stored: woke %v (shard, due), want %v", got, want)
	}

	m = e.request(t, "delayd.schedule", schedule("t.notwritten", "bb2"))
	if errorCode(m) != "503" || !strings.Contains(m.Header.Get(micro.ErrorHeader), "nothing stored") {
		t.Errorf("nothing written: %v, want 503 nothing stored", m.Header)
	}
	if got := e.wakes.since(1); len(got) != 0 {
		t.Errorf("nothing written, yet woke %v", got)
	}

	for _, target := range []string{"t.unknown", "t.notreplicated"} {
		m = e.request(t, "delayd.schedule", schedule(target, ""))
		var unknown unknownReply
		if err := json.Unmarshal(m.Data, &unknown); err != nil || errorCode(m) != "504" {
			t.Fatalf("%s: reply %q %v (%v), want 504 with a body", target, m.Data, m.Header, err)
		}
		if unknown.ID == "" || !e.st.saw(unknown.ID) || !strings.Contains(m.Header.Get(micro.ErrorHeader), "retry with Delayd-Id "+unknown.ID) {
			t.Errorf("%s: 504 names id %q (%s); want the id the store was given", target, unknown.ID, m.Header.Get(micro.ErrorHeader))
		}
		var want [][2]int64
		if target == "t.notreplicated" {
			want = [][2]int64{{int64(e.st.Shard(unknown.ID)), due}}
		}
		if got := e.wakes.since(1); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: woke %v, want %v", target, got, want)
		}
	}

	m = e.request(t, "delayd.schedule", nats.Header{envelope.HeaderDelay: {"1m"}})
	if errorCode(m) != "400" {
		t.Errorf("without a target: %v, want 400", m.Header)
	}
	received, _ := e.obs.counts()
	if want := map[int]int{0: 1, 503: 1, 504: 2, 400: 1}; fmt.Sprint(received) != fmt.Sprint(want) {
		t.Errorf("counted %v, want %v", received, want)
	}
}

// A client holding its reply finds its outcome counted, and a stored
// envelope's shard woken, already: both come before the reply, whatever
// the timing (here the shard lookup before the wake-up is slow). Before,
// the batch's replies went out first and a fast client could look between.
func TestOutcomeCountedBeforeTheReply(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{slowShard: 200 * time.Millisecond})
	if m := e.request(t, "delayd.schedule", schedule("t.ok", "a1")); errorCode(m) != "" {
		t.Fatalf("stored: %v", m.Header)
	}
	if got := e.wakes.since(0); len(got) != 1 {
		t.Errorf("stored and answered, but woke %v", got)
	}
	if m := e.request(t, "delayd.schedule", schedule("t.unknown", "a2")); errorCode(m) != "504" {
		t.Fatalf("outcome unknown: %v", m.Header)
	}
	if m := e.request(t, "delayd.cancel", nats.Header{envelope.HeaderID: {"timeout"}}); errorCode(m) != "504" {
		t.Fatalf("cancel failing in the store: %v", m.Header)
	}
	received, cancelled := e.obs.counts()
	if want := map[int]int{0: 1, 504: 1}; fmt.Sprint(received) != fmt.Sprint(want) {
		t.Errorf("answered, but counted %v, want %v", received, want)
	}
	if len(cancelled) != 1 {
		t.Errorf("cancel answered, but counted %v", cancelled)
	}
}

// A request that waited in the intake longer than the store timeout (Redis
// stalled and every pipeline was busy) is answered 503, nothing stored, and
// never written: its client has likely given up and retried, and a late
// write would overtake that.
func TestScheduleOlderThanStoreTimeout(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	st := &intakeStore{block: make(chan struct{}), in: make(chan string, 16)}
	const timeout = 5 * time.Second
	e := startIntake(t, st, func(o *IntakeOptions) { o.Now, o.storeTimeout, o.PendingBytes = clock.Now, timeout, 1<<30 })
	// Every pipeline stalls in Redis.
	replies := make(chan *nats.Msg, flushers+1)
	send := func(id string) {
		go func() {
			m, err := e.nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: schedule("t.ok", id)}, 10*time.Second)
			if err != nil {
				t.Errorf("schedule %s: %v", id, err)
				m = &nats.Msg{Header: nats.Header{micro.ErrorCodeHeader: {"no reply"}}}
			}
			replies <- m
		}()
	}
	for i := range flushers {
		send(fmt.Sprint("busy", i))
		<-st.in
	}
	// One more request comes in and waits for a pipeline...
	held := e.intake.held.bytes()
	send("late")
	for end := time.Now().Add(10 * time.Second); e.intake.held.bytes() == held; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the last request was not taken in")
		}
	}
	// ...past the store timeout.
	clock.Advance(timeout + time.Millisecond)
	close(st.block)
	codes := map[string]int{}
	for range flushers + 1 {
		m := <-replies
		codes[errorCode(m)]++
		if errorCode(m) == "503" && !strings.Contains(m.Header.Get(micro.ErrorHeader), "nothing stored") {
			t.Errorf("503 says %q", m.Header.Get(micro.ErrorHeader))
		}
	}
	if codes[""] != flushers || codes["503"] != 1 {
		t.Errorf("replies by code %v, want %d stored and one 503", codes, flushers)
	}
	if st.saw("late") {
		t.Error("the request that waited past the store timeout was written")
	}
	// Answered, the stale request holds nothing: its bytes held for good
	// would shrink intake.pending_bytes until every handler waited.
	waitHeld(t, "request intake", e.intake.held)
}

// waitHeld waits up to 10 s for h to hold nothing (the replies go out
// before the bytes are let go), and fails the test if it still holds some.
func waitHeld(t *testing.T, what string, h *heldBytes) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); h.bytes() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: %d bytes still held after the work was done, want 0", what, h.bytes())
		}
	}
}

// The four outcomes of a cancel, as answered and counted: cancelled (and
// whether a delivery may be out), not found, 503 when the store wrote
// nothing, 504 with the id when the outcome is unknown; and a request
// without an id, 400.
func TestCancelOutcomes(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{})
	for _, tc := range []struct {
		id      string
		code    string
		reply   client.Cancelled // for a success
		counted string
	}{
		{"there", "", client.Cancelled{ID: "there", Cancelled: true, InFlight: true}, "cancelled"},
		{"gone", "", client.Cancelled{ID: "gone"}, "not_found"},
		{"down", "503", client.Cancelled{}, "unavailable"},
		{"timeout", "504", client.Cancelled{}, "outcome_unknown"},
		{"", "400", client.Cancelled{}, "bad_request"},
	} {
		h := nats.Header{}
		if tc.id != "" {
			h.Set(envelope.HeaderID, tc.id)
		}
		m := e.request(t, "delayd.cancel", h)
		if errorCode(m) != tc.code {
			t.Errorf("cancel %q: code %q (%s), want %q", tc.id, errorCode(m), m.Header.Get(micro.ErrorHeader), tc.code)
			continue
		}
		switch tc.code {
		case "":
			var got client.Cancelled
			if err := json.Unmarshal(m.Data, &got); err != nil || got != tc.reply {
				t.Errorf("cancel %q: reply %q (%v), want %+v", tc.id, m.Data, err, tc.reply)
			}
		case "504":
			var got unknownReply
			if err := json.Unmarshal(m.Data, &got); err != nil || got.ID != tc.id {
				t.Errorf("cancel %q: 504 body %q (%v), want the id", tc.id, m.Data, err)
			}
		}
		if _, cancelled := e.obs.counts(); cancelled[tc.counted] != 1 {
			t.Errorf("cancel %q: counted %v, want one %s", tc.id, cancelled, tc.counted)
		}
	}
}

// `nats micro stats delayd` counts refusals as errors (they once showed
// Errors 0 after 56 refused schedules), and a schedule's store failure,
// answered after its handler returned where micro cannot count it, in the
// schedule endpoint's data as late_errors with the last one.
func TestMicroStatsCountErrors(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{})
	for range 5 {
		if m := e.request(t, "delayd.schedule", nats.Header{envelope.HeaderDelay: {"1s"}}); errorCode(m) != "400" {
			t.Fatalf("no target: %v, want 400", m.Header)
		}
	}
	if m := e.request(t, "delayd.cancel", nats.Header{}); errorCode(m) != "400" {
		t.Fatalf("cancel without an id: %v, want 400", m.Header)
	}
	if m := e.request(t, "delayd.schedule", schedule("t.notwritten", "n1")); errorCode(m) != "503" {
		t.Fatalf("store down: %v, want 503", m.Header)
	}
	if m := e.request(t, "delayd.schedule", schedule("t.ok", "ok1")); errorCode(m) != "" {
		t.Fatalf("stored: %v", m.Header)
	}
	sch, can := endpointStats(t, e.nc, "schedule"), endpointStats(t, e.nc, "cancel")
	if sch.NumRequests != 7 || sch.NumErrors != 5 || !strings.Contains(sch.LastError, "400") || can.NumErrors != 1 {
		t.Errorf("schedule %d requests, %d errors (last %q), cancel %d errors: want 7, 5 (a 400), 1",
			sch.NumRequests, sch.NumErrors, sch.LastError, can.NumErrors)
	}
	var data struct {
		LateErrors    int    `json:"late_errors"`
		LastLateError string `json:"last_late_error"`
	}
	if err := json.Unmarshal(sch.Data, &data); err != nil || data.LateErrors != 1 || !strings.Contains(data.LastLateError, "nothing stored") {
		t.Errorf("schedule data %s (%v): want late_errors 1, the 503", sch.Data, err)
	}
}

// A request larger than intake.pending_bytes is still taken: the NATS
// client's pending limit is raised to the server's max_payload (before, the
// client dropped it as a slow consumer every time, and its publisher timed
// out and retried forever).
func TestRequestLargerThanPendingBytes(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{}, func(o *IntakeOptions) { o.PendingBytes = 4096 })
	m, err := e.nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: schedule("t.big", "big"),
		Data: make([]byte, 100<<10)}, 10*time.Second)
	if err != nil {
		t.Fatalf("a 100 kB request with pending_bytes 4096: %v", err)
	}
	if code := errorCode(m); code != "" {
		t.Fatalf("a 100 kB request: error %s %s", code, m.Header.Get(micro.ErrorHeader))
	}
}
