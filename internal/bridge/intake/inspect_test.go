package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// inspector is a fake of the intake's Inspector: entries by id, a dead set
// that replay and purge empty, and failures on demand.
type inspector struct {
	mu      sync.Mutex
	entries map[string]store.Entry
	dead    []string // the dead set, in due order
	shards  []store.ShardStats
	fail    error // every call fails with it
	refuse  error // replay and purge fail with it

	// What List answers (when listed is set) and what it was asked.
	listed *listed
	asked  []store.ListOptions
	acted  [][]string // the ids of each replay or purge call
}

type listed struct {
	entries []store.Entry
	next    store.Cursor
	done    bool
}

// errRedisDown is the inspector's failure: Redis unreachable.
var errRedisDown = errors.New("store: dial tcp 127.0.0.1:6379: connect: connection refused")

func (f *inspector) Get(_ context.Context, id string) (store.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return store.Entry{}, f.fail
	}
	e, ok := f.entries[id]
	if !ok {
		return store.Entry{}, fmt.Errorf("store: get %s: %w", id, store.ErrNotFound)
	}
	return e, nil
}

func (f *inspector) List(_ context.Context, o store.ListOptions) ([]store.Entry, store.Cursor, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, o)
	if f.fail != nil {
		return nil, store.Cursor{}, false, f.fail
	}
	if f.listed != nil {
		return f.listed.entries, f.listed.next, f.listed.done, nil
	}
	// The dead set, from the start: what replay or purge with all reads.
	var page []store.Entry
	for _, id := range f.dead[:min(o.Limit, len(f.dead))] {
		page = append(page, store.Entry{ID: id, State: store.StateDead})
	}
	return page, store.Cursor{}, len(page) == len(f.dead), nil
}

func (f *inspector) Stats(context.Context, ...int) ([]store.ShardStats, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, 0, f.fail
	}
	return f.shards, 1_800_000_000_000, nil
}

// act takes the listed ids out of the dead set, as a replay or a purge
// does, and counts those that were there.
func (f *inspector) act(_ context.Context, ids []string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acted = append(f.acted, slices.Clone(ids))
	if f.fail != nil {
		return 0, f.fail
	}
	if f.refuse != nil {
		return 0, f.refuse
	}
	n := 0
	for _, id := range ids {
		if i := slices.Index(f.dead, id); i >= 0 {
			f.dead = slices.Delete(f.dead, i, i+1)
			n++
		}
	}
	return n, nil
}

func (f *inspector) Replay(ctx context.Context, ids []string) (int, error) { return f.act(ctx, ids) }
func (f *inspector) Purge(ctx context.Context, ids []string) (int, error)  { return f.act(ctx, ids) }

func (f *inspector) set(fail, refuse error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.refuse = fail, refuse
}

// with changes the fake under its lock: the intake reads it from its
// handlers' goroutines.
func (f *inspector) with(change func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change()
}

func (f *inspector) lastAsked() store.ListOptions {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[len(f.asked)-1]
}

func (f *inspector) calls() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.acted)
}

// admin sends an operator request and returns the reply.
func (e *intakeEnv) admin(t *testing.T, ep string, h nats.Header, body string) *nats.Msg {
	t.Helper()
	m, err := e.nc.RequestMsg(&nats.Msg{Subject: "delayd.admin." + ep, Header: h, Data: []byte(body)}, 10*time.Second)
	if err != nil {
		t.Fatalf("admin.%s: %v", ep, err)
	}
	return m
}

// wantError checks that m is the error reply code whose description
// contains msg.
func wantError(t *testing.T, what string, m *nats.Msg, code, msg string) {
	t.Helper()
	if got := errorCode(m); got != code || !strings.Contains(m.Header.Get(micro.ErrorHeader), msg) {
		t.Errorf("%s: %s %q, want %s naming %q", what, got, m.Header.Get(micro.ErrorHeader), code, msg)
	}
}

// decodeReply decodes a success reply.
func decodeReply[T any](t *testing.T, what string, m *nats.Msg) T {
	t.Helper()
	var v T
	if code := errorCode(m); code != "" {
		t.Fatalf("%s: error %s %q", what, code, m.Header.Get(micro.ErrorHeader))
	}
	if err := json.Unmarshal(m.Data, &v); err != nil {
		t.Fatalf("%s: reply %q: %v", what, m.Data, err)
	}
	return v
}

func idHeader(id string) nats.Header { return nats.Header{envelope.HeaderID: {id}} }

// get answers what is stored under an id with the headers the operator
// asked to redact replaced (in any case of the name), 404 for an id not
// stored, 400 for a missing or malformed id (never asking the store), and
// 503 when the store fails. Operator requests are not counted as received
// schedules, and a refusal counts in the endpoint's micro stats.
func TestAdminGet(t *testing.T) {
	t.Parallel()
	data := envelope.Encode(envelope.Envelope{Target: "orders.created", Payload: []byte("hello"),
		Header: map[string][]string{"Authorization": {"Bearer s3cret"}, "X-Trace": {"t1"}}})
	insp := &inspector{entries: map[string]store.Entry{
		"o-1":   {ID: "o-1", Shard: 3, State: store.StatePending, DueMs: 1_800_000_000_123, Attempts: 2, Error: "no responders", Data: data},
		"junk":  {ID: "junk", State: store.StateDead, Data: []byte("not an envelope")},
		"no-hd": {ID: "no-hd", State: store.StatePending, Data: envelope.Encode(envelope.Envelope{Target: "a.b"})},
	}}
	e := startIntakeWith(t, &intakeStore{}, insp, func(o *IntakeOptions) { o.RedactHeaders = []string{"authorization"} })

	got := decodeReply[client.Entry](t, "get", e.admin(t, "get", idHeader("o-1"), ""))
	want := client.Entry{ID: "o-1", State: "pending", Due: "2027-01-15T08:00:00.123Z", Target: "orders.created", Size: 5,
		Attempts: 2, Shard: 3, Error: "no responders",
		Header: map[string][]string{"Authorization": {envelope.Redacted}, "X-Trace": {"t1"}}}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("get:\n got %+v\nwant %+v", got, want)
	}
	if e := insp.entries["o-1"]; !strings.Contains(string(e.Data), "s3cret") {
		t.Error("redaction changed the stored envelope")
	}
	got = decodeReply[client.Entry](t, "get undecodable", e.admin(t, "get", idHeader("junk"), ""))
	if got.Target != "(undecodable)" || got.State != "dead" || got.Header != nil {
		t.Errorf("get undecodable: %+v", got)
	}
	raw := decodeReply[map[string]any](t, "get without headers", e.admin(t, "get", idHeader("no-hd"), ""))
	if _, ok := raw["headers"]; ok {
		t.Errorf("get without headers: %v, want no headers key", raw)
	}

	wantError(t, "unknown id", e.admin(t, "get", idHeader("nope"), ""), "404", "no envelope with id nope")
	wantError(t, "no id", e.admin(t, "get", nil, ""), "400", "missing header "+envelope.HeaderID)
	wantError(t, "long id", e.admin(t, "get", idHeader(strings.Repeat("x", 257)), ""), "400", "limit is 256")
	wantError(t, "control character", e.admin(t, "get", idHeader("a\x01b"), ""), "400", "control character")
	insp.set(errRedisDown, nil)
	m := e.admin(t, "get", idHeader("o-1"), "")
	wantError(t, "store down", m, "503", "store unavailable")
	if strings.Contains(m.Header.Get(micro.ErrorHeader), "6379") {
		t.Errorf("the 503 leaks the store's error: %q", m.Header.Get(micro.ErrorHeader))
	}

	if received, _ := e.obs.counts(); len(received) != 0 {
		t.Errorf("operator requests counted as received: %v", received)
	}
	if ep := endpointStats(t, e.nc, "get"); ep.NumRequests != 8 || ep.NumErrors != 5 {
		t.Errorf("get stats: %d requests, %d errors; want 8 and 5", ep.NumRequests, ep.NumErrors)
	}
}

// endpointStats is the named endpoint's entry in $SRV.STATS.
func endpointStats(t *testing.T, nc *nats.Conn, name string) *micro.EndpointStats {
	t.Helper()
	m, err := nc.Request("$SRV.STATS.delayd", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s micro.Stats
	if err := json.Unmarshal(m.Data, &s); err != nil {
		t.Fatal(err)
	}
	for _, ep := range s.Endpoints {
		if ep.Name == name {
			return ep
		}
	}
	t.Fatalf("no endpoint %s in %s", name, m.Data)
	return nil
}

// list passes the request's bounds to the store (default limit 100,
// pending unless dead, due_before in ms, the cursor decoded), filters the
// page by target pattern, and answers the next cursor unless the page is
// the last. Bad bodies are 400 without asking the store; a store failure
// is 503.
func TestAdminList(t *testing.T) {
	t.Parallel()
	enc := func(target string) []byte {
		return envelope.Encode(envelope.Envelope{Target: target, Payload: []byte("xyz")})
	}
	next := store.Cursor{DueMs: 1_800_000_000_500, ID: "c/3"}
	insp := &inspector{listed: &listed{next: next, entries: []store.Entry{
		{ID: "a", State: store.StatePending, DueMs: 1_800_000_000_000, Data: enc("orders.eu.created")},
		{ID: "b", State: store.StatePending, DueMs: 1_800_000_000_100, Shard: 1, Data: enc("billing.run")},
		{ID: "c/3", State: store.StatePending, DueMs: 1_800_000_000_500, Shard: 2, Attempts: 1,
			Data: envelope.Encode(envelope.Envelope{Target: "orders.us.created", Header: map[string][]string{"X": {"y"}}})},
	}}}
	e := startIntakeWith(t, &intakeStore{}, insp)

	page := decodeReply[client.Page](t, "list", e.admin(t, "list", nil, ""))
	if o := insp.lastAsked(); o != (store.ListOptions{State: store.StatePending, Limit: 100}) {
		t.Errorf("an empty body asked the store for %+v, want pending, limit 100", o)
	}
	if len(page.Entries) != 3 || page.Next != next.String() {
		t.Fatalf("list: %+v, want 3 entries and next %q", page, next)
	}
	if got, want := page.Entries[2], (client.Entry{ID: "c/3", State: "pending", Due: envelope.FormatMs(1_800_000_000_500),
		Target: "orders.us.created", Attempts: 1, Shard: 2}); fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("list entry %+v, want %+v (no headers in a list)", got, want)
	}

	body := fmt.Sprintf(`{"target":"orders.*.created","due_before":"2027-01-15T08:00:00.250Z","limit":1000,"cursor":%q,"dead":true}`, next)
	page = decodeReply[client.Page](t, "list filtered", e.admin(t, "list", nil, body))
	if o, want := insp.lastAsked(), (store.ListOptions{State: store.StateDead, DueBefore: 1_800_000_000_250, Limit: 1000, Cursor: next}); o != want {
		t.Errorf("asked the store for %+v, want %+v", o, want)
	}
	var ids []string
	for _, en := range page.Entries {
		ids = append(ids, en.ID)
	}
	if fmt.Sprint(ids) != "[a c/3]" {
		t.Errorf("target orders.*.created kept %v, want [a c/3]", ids)
	}

	insp.with(func() { insp.listed.done = true })
	page = decodeReply[client.Page](t, "last page", e.admin(t, "list", nil, `{"limit":1}`))
	if page.Next != "" {
		t.Errorf("the last page has next %q", page.Next)
	}
	insp.with(func() { insp.listed.entries = nil })
	raw := decodeReply[map[string]any](t, "empty page", e.admin(t, "list", nil, ""))
	if fmt.Sprint(raw) != "map[entries:[]]" {
		t.Errorf("an empty page is %v, want entries [] and no next", raw)
	}

	asked := len(insp.asked) // the handlers are done: each request was answered
	for _, tc := range []struct{ body, msg string }{
		{`{"limit":`, "list body must be JSON"},
		{`[1]`, "list body must be JSON"},
		{`{"limit":-1}`, "limit must be 1..1000, got -1"},
		{`{"limit":1001}`, "limit must be 1..1000, got 1001"},
		{`{"due_before":"tomorrow"}`, "due_before is not an RFC 3339 time"},
		{`{"target":"orders..x"}`, "target is not a subject pattern"},
		{`{"cursor":"12-!!"}`, "bad cursor"},
	} {
		wantError(t, tc.body, e.admin(t, "list", nil, tc.body), "400", tc.msg)
	}
	if n := len(insp.asked); n != asked {
		t.Errorf("refused lists asked the store %d times", n-asked)
	}
	insp.set(errRedisDown, nil)
	wantError(t, "store down", e.admin(t, "list", nil, ""), "503", "store unavailable")
}

// stats sums the shards' counts and answers the earliest next due time
// of the shards that have one, the store's clock as now, and 503 when the
// store fails.
func TestAdminStats(t *testing.T) {
	t.Parallel()
	insp := &inspector{shards: []store.ShardStats{
		{Shard: 0, Counts: store.Counts{Pending: 2, Inflight: 1}, NextDueMs: 1_800_000_000_900},
		{Shard: 1, Counts: store.Counts{Dead: 4}, NextDueMs: -1},
		{Shard: 2, Counts: store.Counts{Pending: 5, Dead: 1}, NextDueMs: 1_800_000_000_100},
	}}
	e := startIntakeWith(t, &intakeStore{}, insp)
	got := decodeReply[client.Stats](t, "stats", e.admin(t, "stats", nil, ""))
	want := client.Stats{Now: envelope.FormatMs(1_800_000_000_000), Pending: 7, Inflight: 1, Dead: 5,
		NextDue: envelope.FormatMs(1_800_000_000_100), Shards: []client.ShardStats{
			{Shard: 0, Pending: 2, Inflight: 1, NextDue: envelope.FormatMs(1_800_000_000_900)},
			{Shard: 1, Dead: 4},
			{Shard: 2, Pending: 5, Dead: 1, NextDue: envelope.FormatMs(1_800_000_000_100)},
		}}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("stats:\n got %+v\nwant %+v", got, want)
	}

	insp.with(func() { insp.shards = []store.ShardStats{{Shard: 0, NextDueMs: -1}} })
	raw := decodeReply[map[string]any](t, "stats empty", e.admin(t, "stats", nil, ""))
	if _, ok := raw["next_due"]; ok {
		t.Errorf("nothing pending, yet next_due in %v", raw)
	}
	insp.set(errRedisDown, nil)
	wantError(t, "store down", e.admin(t, "stats", nil, ""), "503", "store unavailable")
}

// replay and purge act on the listed ids, or with all on the dead set
// page by page (always the first page: what was acted on left it) up to
// a bound per call, then say there is more. A body that is not JSON, or
// that names neither or both of ids and all, is 400 and acts on nothing;
// a store failure is 503.
func TestAdminReplayAndPurge(t *testing.T) {
	t.Parallel()
	for _, verb := range []string{"replay", "purge"} {
		t.Run(verb, func(t *testing.T) {
			t.Parallel()
			insp := &inspector{dead: []string{"d1", "d2", "d3"}}
			e := startIntakeWith(t, &intakeStore{}, insp)

			res := decodeReply[client.DeadResult](t, "ids", e.admin(t, verb, nil, `{"ids":["d2","gone"]}`))
			if res != (client.DeadResult{Count: 1}) || fmt.Sprint(insp.calls()) != "[[d2 gone]]" {
				t.Errorf("ids: %+v after calls %v, want count 1 from one call with [d2 gone]", res, insp.calls())
			}

			for _, body := range []string{``, `{"ids":`, `{}`, `{"ids":[]}`, `{"all":false}`, `{"ids":["d1"],"all":true}`} {
				wantError(t, fmt.Sprintf("body %q", body), e.admin(t, verb, nil, body), "400",
					verb+` body must be {"ids": [...]} or {"all": true}`)
			}
			if n := len(insp.calls()); n != 1 {
				t.Errorf("refused bodies acted: %d calls", n)
			}

			insp.set(errRedisDown, nil)
			wantError(t, "store down", e.admin(t, verb, nil, `{"ids":["d1"]}`), "503", "store unavailable")
			wantError(t, "store down, all", e.admin(t, verb, nil, `{"all":true}`), "503", "store unavailable")
			insp.set(nil, nil)

			insp.with(func() {
				insp.acted, insp.asked, insp.dead = nil, nil, nil
				for i := range maxDeadBatch + 1500 {
					insp.dead = append(insp.dead, fmt.Sprintf("x%05d", i))
				}
			})
			res = decodeReply[client.DeadResult](t, "all", e.admin(t, verb, nil, `{"all":true}`))
			calls := insp.calls()
			if res != (client.DeadResult{Count: maxDeadBatch, More: true}) || len(calls) != maxDeadBatch/maxListLimit ||
				len(calls[0]) != maxListLimit || calls[1][0] != "x01000" {
				t.Errorf("all: %+v in %d calls, want %d and more, in pages of %d from the first", res, len(calls), maxDeadBatch, maxListLimit)
			}
			for _, o := range insp.asked { // answered: nothing lists now
				if o != (store.ListOptions{State: store.StateDead, Limit: maxListLimit}) {
					t.Errorf("all listed %+v, want the first page of the dead set", o)
				}
			}
			res = decodeReply[client.DeadResult](t, "all, the rest", e.admin(t, verb, nil, `{"all":true}`))
			if res != (client.DeadResult{Count: 1500}) {
				t.Errorf("all, the rest: %+v, want 1500 and no more", res)
			}
			res = decodeReply[client.DeadResult](t, "all, none left", e.admin(t, verb, nil, `{"all":true}`))
			if res != (client.DeadResult{}) {
				t.Errorf("all on an empty dead set: %+v", res)
			}
		})
	}
}
