package intake

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// batchResult is one envelope's result in a batch reply.
type batchResult struct {
	ID        string    `json:"id"`
	DeliverAt time.Time `json:"deliver_at"`
	Code      int       `json:"code"`
	Error     string    `json:"error"`
}

// batchBody is the JSON body of a batch of envelopes given by headers.
func batchBody(t *testing.T, hs ...nats.Header) []byte {
	t.Helper()
	type entry struct {
		Headers nats.Header `json:"headers"`
		Payload string      `json:"payload"`
	}
	es := make([]entry, len(hs))
	for i, h := range hs {
		es[i] = entry{Headers: h, Payload: base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("payload %d", i)))}
	}
	b, err := json.Marshal(es)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *intakeEnv) batch(t *testing.T, body []byte, h nats.Header) *nats.Msg {
	t.Helper()
	if h == nil {
		h = nats.Header{envelope.HeaderBatch: {envelope.BatchJSON}}
	}
	m, err := e.nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: h, Data: body}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func batchResults(t *testing.T, m *nats.Msg) []batchResult {
	t.Helper()
	var r struct{ Results []batchResult }
	if err := json.Unmarshal(m.Data, &r); err != nil || errorCode(m) != "" {
		t.Fatalf("batch reply %q %v: %v", m.Data, m.Header, err)
	}
	return r.Results
}

// Each envelope of a batch stands alone: the valid ones are stored, each
// refused one (400, 403, a second of the same id) gets its own code, and
// the store's outcome is answered per envelope (503 nothing stored; 504
// with the id to resend with), all in one reply in the batch's order.
func TestBatchEnvelopesStandAlone(t *testing.T) {
	t.Parallel()
	e := startIntake(t, &intakeStore{})
	const due = int64(1_800_000_000_123)
	body := batchBody(t,
		schedule("t.ok", "a1"),
		nats.Header{envelope.HeaderDelay: {"1m"}}, // no target
		schedule("t.notwritten", "b2"),
		schedule("$SYS.x", "c3"),
		schedule("t.unknown", ""),
		schedule("t.ok", "a1"), // the same id again
		schedule("t.ok", ""),
	)
	// An entry that is not an object of headers and payload is refused alone.
	body = append(body[:len(body)-1], []byte(`,{"headers":{"Delayd-Target":"t.ok"},"payload":"not base64!"},42]`)...)
	res := batchResults(t, e.batch(t, body, nil))
	if len(res) != 9 {
		t.Fatalf("%d results, want 9: %+v", len(res), res)
	}
	if r := res[0]; r.ID != "a1" || !r.DeliverAt.Equal(time.UnixMilli(due)) || r.Code != 0 {
		t.Errorf("stored: %+v", r)
	}
	if r := res[6]; r.ID == "" || r.Code != 0 || !e.st.saw(r.ID) {
		t.Errorf("stored with a made id: %+v", r)
	}
	for i, want := range map[int]int{1: 400, 2: 503, 3: 403, 4: 504, 5: 400, 7: 400, 8: 400} {
		if res[i].Code != want || res[i].Error == "" {
			t.Errorf("envelope %d: %+v, want code %d with a message", i, res[i], want)
		}
	}
	if r := res[4]; r.ID == "" || !e.st.saw(r.ID) || !strings.Contains(r.Error, "retry with Delayd-Id "+r.ID) {
		t.Errorf("504 names id %q (%s): want the id the store was given", r.ID, r.Error)
	}
	if !strings.Contains(res[5].Error, "earlier in this batch") {
		t.Errorf("duplicate id: %s", res[5].Error)
	}
	received, _ := e.obs.counts()
	if want := map[int]int{0: 2, 400: 4, 403: 1, 503: 1, 504: 1}; fmt.Sprint(received) != fmt.Sprint(want) {
		t.Errorf("counted %v, want %v", received, want)
	}
	if got := len(e.wakes.since(0)); got != 2 {
		t.Errorf("woke %d shards, want one per stored envelope (2)", got)
	}
	if n := e.intake.held.bytes(); n != 0 {
		t.Errorf("%d bytes still held after the reply", n)
	}
}

// A batch over intake.max_batch, or one that is not a batch of envelopes,
// is refused as a whole, with a micro error, and nothing of it is stored.
func TestBatchRefusedWhole(t *testing.T) {
	t.Parallel()
	st := &intakeStore{}
	e := startIntake(t, st, func(o *IntakeOptions) { o.MaxBatch = 3 })
	four := batchBody(t, schedule("t.ok", "w1"), schedule("t.ok", "w2"), schedule("t.ok", "w3"), schedule("t.ok", "w4"))
	three := batchBody(t, schedule("t.ok", "w1"), schedule("t.ok", "w2"), schedule("t.ok", "w3"))
	for _, tc := range []struct {
		name string
		body []byte
		h    nats.Header
		code string
		msg  string
	}{
		{"over max_batch", four, nil, "413", "holds 4 envelopes, over the limit of 3 (intake.max_batch)"},
		{"not an array", []byte(`{"headers":{}}`), nil, "400", "JSON array"},
		{"not JSON", []byte(`[{`), nil, "400", "JSON array"},
		{"unknown format", three, nats.Header{envelope.HeaderBatch: {"frames"}}, "400", "not a batch format"},
		{"another header", three, nats.Header{envelope.HeaderBatch: {"json"}, envelope.HeaderTarget: {"t.ok"}}, "400", "not allowed on the batch message"},
	} {
		m := e.batch(t, tc.body, tc.h)
		if errorCode(m) != tc.code || !strings.Contains(m.Header.Get(micro.ErrorHeader), tc.msg) {
			t.Errorf("%s: %s %q, want %s %q", tc.name, errorCode(m), m.Header.Get(micro.ErrorHeader), tc.code, tc.msg)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.seen) != 0 {
		t.Errorf("stored %v of refused batches", st.seen)
	}
}

// An empty batch, or one whose every envelope is refused, is answered at
// once, without a write.
func TestBatchWithNothingToStore(t *testing.T) {
	t.Parallel()
	st := &intakeStore{}
	e := startIntake(t, st)
	if res := batchResults(t, e.batch(t, []byte(`[]`), nil)); len(res) != 0 {
		t.Errorf("empty batch: %+v", res)
	}
	res := batchResults(t, e.batch(t, batchBody(t, schedule("$SYS.x", "")), nil))
	if len(res) != 1 || res[0].Code != 403 {
		t.Errorf("all refused: %+v", res)
	}
	if len(st.seen) != 0 {
		t.Errorf("stored %v", st.seen)
	}
}

// A batch taken while delayd stops (its queue closed) is refused whole
// with 503, as a single request is: nothing of it stored, so the client
// resends the batch as it is.
func TestBatchWhileStopping(t *testing.T) {
	t.Parallel()
	st := &intakeStore{}
	e := startIntake(t, st)
	e.intake.gate.close(func() { close(e.intake.queue) })
	m := e.batch(t, batchBody(t, schedule("t.ok", "s1"), schedule("$SYS.x", "")), nil)
	if errorCode(m) != "503" || !strings.Contains(m.Header.Get(micro.ErrorHeader), "nothing of the batch stored") {
		t.Errorf("while stopping: %s %q, want 503", errorCode(m), m.Header.Get(micro.ErrorHeader))
	}
	if st.saw("s1") {
		t.Error("stored while stopping")
	}
}

// The reply holds one result per envelope, whatever the envelopes: each
// refusal quotes at most a short prefix of a publisher's value, and a
// batch whose reply could outgrow the server's max_payload (every valid
// envelope answered with the longest 504) is refused whole with 413
// before anything is stored. Before, such a reply was dropped ("nats:
// maximum payload exceeded"): the client timed out on stored envelopes.
func TestBatchReplyFitsMaxPayload(t *testing.T) {
	t.Parallel()
	const maxPayload = 64 << 10
	st := &intakeStore{}
	e := startIntakeOn(t, testutil.StartNATS(t, func(o *server.Options) { o.MaxPayload = maxPayload }), st, noInspector{})

	// 50 targets of 1000 '>' (each 6 bytes in a JSON reply, \u003e): quoted
	// whole, the refusals took 300 kB.
	one := `{"headers":{"Delayd-Target":"t.` + strings.Repeat(">", 1000) + `","Delayd-Delay":"1m"}}`
	res := batchResults(t, e.batch(t, []byte("["+strings.Repeat(one+",", 49)+one+"]"), nil))
	if len(res) != 50 {
		t.Fatalf("%d results for 50 envelopes", len(res))
	}
	for i, r := range res {
		if r.Code != 400 || !strings.Contains(r.Error, "…") || len(r.Error) > 300 {
			t.Fatalf("envelope %d: %d %q (%d bytes), want 400 quoting a short prefix", i, r.Code, r.Error, len(r.Error))
		}
	}

	// 150 valid envelopes of 256-byte ids: the request is 50 kB, and their
	// replies, 504 each naming its id twice, would take 105 kB.
	hs := make([]nats.Header, 150)
	for i := range hs {
		hs[i] = schedule("t.notreplicated", fmt.Sprintf("%03d", i)+strings.Repeat("x", 253))
	}
	body := batchBody(t, hs...)
	if len(body) >= maxPayload {
		t.Fatalf("the request is %d bytes", len(body))
	}
	m := e.batch(t, body, nil)
	if errorCode(m) != "413" || !strings.Contains(m.Header.Get(micro.ErrorHeader), fmt.Sprintf("would exceed max_payload %d", maxPayload)) {
		t.Errorf("%s %q, want 413 the reply would exceed max_payload", errorCode(m), m.Header.Get(micro.ErrorHeader))
	}
	st.mu.Lock()
	if len(st.seen) != 0 {
		t.Errorf("stored %d envelopes of a batch refused whole", len(st.seen))
	}
	st.mu.Unlock()
	// Fewer of them fit, and are stored.
	if res := batchResults(t, e.batch(t, batchBody(t, hs[:50]...), nil)); len(res) != 50 || res[0].Code != 504 {
		t.Errorf("50 envelopes: %d results, first %+v", len(res), res[0])
	}
}

// worstResult bounds every result a queued envelope can get.
func TestWorstResult(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a", strings.Repeat("x", 256), `<&>"\`, "é\x01"} {
		w := worstResult(id)
		for _, err := range []error{errNotWritten, errUnknown, errShortWait} {
			code, msg, _ := storeFailure(id, err)
			if n := len(failureResult(id, code, msg)); n > w {
				t.Errorf("id %q: %v takes %d bytes, worst %d", id, err, n, w)
			}
		}
		if n := len(failureResult("", 503, staleMsg)); n > w {
			t.Errorf("id %q: the 503 takes %d bytes, worst %d", id, n, w)
		}
		for _, at := range []int64{0, 1_800_000_000_123, 253402300799999} {
			if n := len(appendScheduled(nil, id, at)); n > w {
				t.Errorf("id %q: stored takes %d bytes, worst %d", id, n, w)
			}
		}
	}
}

// A batch request that waited in the intake longer than the store timeout
// is answered as a single request is (TestScheduleOlderThanStoreTimeout):
// each envelope 503 unwritten and counted, and the batch's bytes let go.
// Both kinds of request reach that check through the one flush.
func TestBatchOlderThanStoreTimeout(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	st := &intakeStore{block: make(chan struct{}), in: make(chan string, 16)}
	const timeout = 5 * time.Second
	e := startIntake(t, st, func(o *IntakeOptions) { o.Now, o.storeTimeout = clock.Now, timeout })
	// Every pipeline stalls in Redis.
	replies := make(chan *nats.Msg, flushers+1)
	request := func(h nats.Header, body []byte) {
		go func() {
			m, err := e.nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: h, Data: body}, 10*time.Second)
			if err != nil {
				t.Errorf("%v: %v", h, err)
				m = &nats.Msg{Header: nats.Header{micro.ErrorCodeHeader: {"no reply"}}}
			}
			replies <- m
		}()
	}
	for i := range flushers {
		request(schedule("t.ok", fmt.Sprint("busy", i)), nil)
		<-st.in
	}
	// A batch comes in and waits for a pipeline past the store timeout.
	held := e.intake.held.bytes()
	request(nats.Header{envelope.HeaderBatch: {envelope.BatchJSON}}, batchBody(t, schedule("t.ok", "late1"), schedule("t.ok", "late2")))
	if !testutil.Eventually(10*time.Second, func() bool { return e.intake.held.bytes() != held }) {
		t.Fatal("the batch was not taken in")
	}
	clock.Advance(timeout + time.Millisecond)
	close(st.block)
	var batch *nats.Msg
	for range flushers + 1 {
		if m := <-replies; len(m.Data) > 0 && m.Data[0] == '{' && strings.Contains(string(m.Data), "results") {
			batch = m
		} else if errorCode(m) != "" {
			t.Errorf("a request that was not late: %s %s", errorCode(m), m.Header.Get(micro.ErrorHeader))
		}
	}
	if batch == nil {
		t.Fatal("no reply to the batch")
	}
	res := batchResults(t, batch)
	if len(res) != 2 || res[0].Code != 503 || res[1].Code != 503 || res[0].Error != staleMsg || res[0].ID != "" {
		t.Errorf("the late batch's results: %+v, want two 503 %q without an id", res, staleMsg)
	}
	if st.saw("late1") || st.saw("late2") {
		t.Error("an envelope of the batch that waited past the store timeout was written")
	}
	if received, _ := e.obs.counts(); received[503] != 2 || received[0] != flushers {
		t.Errorf("counted %v, want %d stored and two 503", received, flushers)
	}
	waitHeld(t, "request intake", e.intake.held)
}
