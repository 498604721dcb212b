package admin

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

//go:embed ui
var uiFiles embed.FS

// UIStore is what the console reads and changes: the same store functions
// the CLI's endpoints use. None of them scans Redis.
type UIStore interface {
	Get(ctx context.Context, id string) (store.Entry, error)
	List(ctx context.Context, o store.ListOptions) ([]store.Entry, store.Cursor, bool, error)
	Stats(ctx context.Context, shards ...int) ([]store.ShardStats, int64, error)
	Owners(ctx context.Context) ([]string, error)
	DueCounts(ctx context.Context, edgesMs []int64) ([]int64, error)
	Cancel(ctx context.Context, id string) (store.Cancelled, error)
	Replay(ctx context.Context, ids []string) (int, error)
	Purge(ctx context.Context, ids []string) (int, error)
}

// UIOptions configure the console.
type UIOptions struct {
	AllowActions bool // cancel, replay, purge, limits and pauses; read-only otherwise
	// ShowPayloads shows payload previews and header values; otherwise
	// only sizes and header names leave the daemon.
	ShowPayloads bool
	// RedactHeaders are never shown with their values, even with
	// ShowPayloads: they carry credentials.
	RedactHeaders []string
	BasicUser     string
	BasicPass     string
	BearerToken   string
	Policy        envelope.Policy
	JetStream     []string
	// Flow is flow control, shown and changed on its own page; nil: the
	// page says it is not available.
	Flow UIFlow
}

// UI is the web console at /ui.
type UI struct {
	st  UIStore
	m   *Metrics
	opt UIOptions
	log hclog.Logger
}

// NewUI builds the console.
func NewUI(st UIStore, m *Metrics, opt UIOptions, log hclog.Logger) *UI {
	return &UI{st: st, m: m, opt: opt, log: log}
}

const csrfCookie = "delayd_csrf"

// register mounts the console on mux.
func (u *UI) register(mux *http.ServeMux) {
	static, _ := fs.Sub(uiFiles, "ui")
	files := http.StripPrefix("/ui/", http.FileServer(http.FS(static)))
	mux.Handle("GET /ui/", u.auth(files))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	mux.Handle("GET /ui/api/session", u.auth(http.HandlerFunc(u.session)))
	mux.Handle("GET /ui/api/overview", u.auth(http.HandlerFunc(u.overview)))
	mux.Handle("GET /ui/api/envelope", u.auth(http.HandlerFunc(u.envelope)))
	mux.Handle("GET /ui/api/list", u.auth(http.HandlerFunc(u.list)))
	mux.Handle("GET /ui/api/targets", u.auth(http.HandlerFunc(u.targets)))
	mux.Handle("POST /ui/api/cancel", u.auth(u.action(u.cancel)))
	mux.Handle("POST /ui/api/replay", u.auth(u.action(u.dead(u.st.Replay))))
	mux.Handle("POST /ui/api/purge", u.auth(u.action(u.dead(u.st.Purge))))
	mux.Handle("GET /ui/api/flow", u.auth(http.HandlerFunc(u.flowRules)))
	mux.Handle("POST /ui/api/limit", u.auth(u.action(u.limit)))
	mux.Handle("POST /ui/api/pause", u.auth(u.action(u.pause(false))))
	mux.Handle("POST /ui/api/resume", u.auth(u.action(u.pause(true))))
}

// auth requires the configured basic auth or bearer token, if any.
func (u *UI) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.opt.BasicUser == "" && u.opt.BearerToken == "" {
			next.ServeHTTP(w, r)
			return
		}
		if u.opt.BearerToken != "" && equal(r.Header.Get("Authorization"), "Bearer "+u.opt.BearerToken) {
			next.ServeHTTP(w, r)
			return
		}
		if user, pass, ok := r.BasicAuth(); ok && u.opt.BasicUser != "" && equal(user, u.opt.BasicUser) && equal(pass, u.opt.BasicPass) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="delayd"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
	})
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// action guards a state-changing request: actions must be enabled, and the
// X-CSRF-Token header must match the session cookie (double submit, with a
// SameSite=Strict cookie), so another site cannot make a browser act.
func (u *UI) action(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !u.opt.AllowActions {
			http.Error(w, "the console is read-only (ui.allow_actions is false)", http.StatusForbidden)
			return
		}
		c, err := r.Cookie(csrfCookie)
		if err != nil || c.Value == "" || !equal(c.Value, r.Header.Get("X-CSRF-Token")) {
			http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
			return
		}
		h(w, r)
	})
}

// session tells the page what it may do and hands it a CSRF token.
func (u *UI) session(w http.ResponseWriter, r *http.Request) {
	token := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		token = c.Value
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		token = hex.EncodeToString(b)
	}
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: token, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	writeJSON(w, map[string]any{"allow_actions": u.opt.AllowActions, "csrf": token})
}

// dueEdges are the overview chart's buckets, relative to now.
var dueEdges = []struct {
	label string
	after time.Duration
}{
	{"overdue", 0}, {"< 1 min", time.Minute}, {"1–5 min", 5 * time.Minute}, {"5–15 min", 15 * time.Minute},
	{"15–60 min", time.Hour}, {"1–6 h", 6 * time.Hour}, {"6–24 h", 24 * time.Hour}, {"1–7 d", 7 * 24 * time.Hour},
}

func (u *UI) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	shards, nowMs, err := u.st.Stats(ctx)
	if err != nil {
		u.unavailable(w, err)
		return
	}
	owners, _ := u.st.Owners(ctx)
	edges := make([]int64, len(dueEdges))
	for i, e := range dueEdges {
		edges[i] = nowMs + e.after.Milliseconds()
	}
	counts, err := u.st.DueCounts(ctx, edges)
	if err != nil {
		u.unavailable(w, err)
		return
	}
	type bar struct {
		Label string `json:"label"`
		Count int64  `json:"count"`
	}
	due := make([]bar, 0, len(counts))
	for i, c := range counts {
		label := "> 7 d"
		if i < len(dueEdges) {
			label = dueEdges[i].label
		}
		due = append(due, bar{label, c})
	}
	type shardRow struct {
		Shard    int    `json:"shard"`
		Pending  int64  `json:"pending"`
		Inflight int64  `json:"inflight"`
		Dead     int64  `json:"dead"`
		NextDue  string `json:"next_due,omitempty"`
		Owner    string `json:"owner,omitempty"`
	}
	var tot store.Counts
	rows := make([]shardRow, len(shards))
	for i, s := range shards {
		tot.Pending += s.Counts.Pending
		tot.Inflight += s.Counts.Inflight
		tot.Dead += s.Counts.Dead
		rows[i] = shardRow{Shard: s.Shard, Pending: s.Counts.Pending, Inflight: s.Counts.Inflight, Dead: s.Counts.Dead}
		if s.NextDueMs >= 0 {
			rows[i].NextDue = consoleTime(s.NextDueMs)
		}
		if i < len(owners) {
			rows[i].Owner = owners[i]
		}
	}
	rate, _ := u.m.recent.snapshot(time.Now())
	writeJSON(w, map[string]any{
		"now": envelope.FormatMs(nowMs), "pending": tot.Pending, "inflight": tot.Inflight, "dead": tot.Dead,
		"due": due, "lateness": u.m.latenessBuckets(), "rate": rate, "shards": rows,
	})
}

// entryView is one envelope as the console shows it.
type entryView struct {
	ID       string              `json:"id"`
	State    string              `json:"state"`
	Due      string              `json:"due"`
	Target   string              `json:"target"`
	Size     int                 `json:"size"`
	Attempts int                 `json:"attempts"`
	Error    string              `json:"error,omitempty"`
	Header   map[string][]string `json:"headers,omitempty"`
	Preview  string              `json:"preview,omitempty"`
	Hex      bool                `json:"hex,omitempty"`
	// Hidden says payload and header values were withheld
	// (ui.show_payloads is false).
	Hidden bool `json:"hidden,omitempty"`
	// Series is a recurring series' rule, Occurrence the number of the
	// pending one (Due is its due time).
	Series     string `json:"series,omitempty"`
	Occurrence int64  `json:"occurrence,omitempty"`
}

const previewBytes = 512

// hiddenValue stands for a header value withheld by ui.show_payloads.
const hiddenValue = "(hidden)"

// detail adds the envelope's headers and payload preview to v, as much of
// them as the options allow.
func (u *UI) detail(e store.Entry) entryView {
	v := view(e, true)
	v.Header = envelope.RedactHeaders(v.Header, u.opt.RedactHeaders)
	if !u.opt.ShowPayloads {
		for k, vs := range v.Header {
			hidden := make([]string, len(vs))
			for i := range hidden {
				hidden[i] = hiddenValue
			}
			v.Header[k] = hidden
		}
		v.Preview, v.Hex, v.Hidden = "", false, true
	}
	return v
}

func view(e store.Entry, detail bool) entryView {
	v := entryView{ID: e.ID, State: string(e.State), Due: consoleTime(e.DueMs), Attempts: e.Attempts, Error: e.Error}
	env, err := envelope.Decode(e.Data)
	if err != nil {
		v.Target = "(undecodable)"
		return v
	}
	v.Target, v.Size = env.Target, len(env.Payload)
	if env.Series != nil {
		v.Series, v.Occurrence = env.Series.String(), e.Occurrence
	}
	if detail {
		v.Header = env.Header
		p := env.Payload[:min(len(env.Payload), previewBytes)]
		if utf8.Valid(p) {
			v.Preview = string(p)
		} else {
			v.Preview, v.Hex = hex.Dump(p), true
		}
	}
	return v
}

func (u *UI) envelope(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		http.Error(w, "id is required", http.StatusBadRequest)
		return
	}
	e, err := u.st.Get(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		http.Error(w, "no envelope with id "+id, http.StatusNotFound)
		return
	}
	if err != nil {
		u.unavailable(w, err)
		return
	}
	writeJSON(w, u.detail(e))
}

func (u *UI) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := store.ListOptions{State: store.StatePending, Limit: 50}
	if q.Get("dead") == "1" {
		o.State = store.StateDead
	}
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n > 0 {
		o.Limit = min(n, 500)
	}
	var err error
	if o.Cursor, err = store.ParseCursor(q.Get("cursor")); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var after int64
	for key, dst := range map[string]*int64{"due_before": &o.DueBefore, "due_after": &after} {
		if v := q.Get(key); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				http.Error(w, key+" must be RFC 3339", http.StatusBadRequest)
				return
			}
			*dst = t.UnixMilli()
		}
	}
	if after > 0 && q.Get("cursor") == "" {
		// Pages are in due order: start right before due_after instead
		// of filtering pages of earlier envelopes away. No valid UTF-8
		// id sorts after "\xff", so this skips every due < after.
		o.Cursor = store.Cursor{DueMs: after - 1, ID: "\xff"}
	}
	target := q.Get("target")
	if target != "" && !envelope.ValidPattern(target) {
		http.Error(w, "target must be a subject pattern", http.StatusBadRequest)
		return
	}
	entries, next, done, err := u.st.List(r.Context(), o)
	if err != nil {
		u.unavailable(w, err)
		return
	}
	out := []entryView{}
	for _, e := range entries {
		v := view(e, false)
		if (target == "" || envelope.Match(target, v.Target)) && e.DueMs >= after {
			out = append(out, v)
		}
	}
	page := map[string]any{"entries": out}
	if !done {
		page["next"] = next.String()
	}
	writeJSON(w, page)
}

// targets counts pending envelopes per target over a bounded sample (the
// first page of each shard) and deliveries per target over the last five
// minutes, with the target policy.
func (u *UI) targets(w http.ResponseWriter, r *http.Request) {
	const sample = 2000
	entries, _, done, err := u.st.List(r.Context(), store.ListOptions{State: store.StatePending, Limit: sample})
	if err != nil {
		u.unavailable(w, err)
		return
	}
	pending := map[string]int{}
	for _, e := range entries {
		pending[view(e, false).Target]++
	}
	_, delivered := u.m.recent.snapshot(time.Now())
	type row struct {
		Target    string `json:"target"`
		Pending   int    `json:"pending"`
		Delivered int    `json:"delivered_5m"`
	}
	rows := map[string]*row{}
	for t, n := range pending {
		rows[t] = &row{Target: t, Pending: n}
	}
	for t, n := range delivered {
		if rows[t] == nil {
			rows[t] = &row{Target: t}
		}
		rows[t].Delivered = n
	}
	list := make([]*row, 0, len(rows))
	for _, r := range rows {
		list = append(list, r)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Pending+list[i].Delivered > list[j].Pending+list[j].Delivered })
	writeJSON(w, map[string]any{
		"targets": list, "sampled": !done, "sample_size": len(entries),
		"builtin_deny": builtinDeny(u.opt.Policy.Prefix), "allow": u.opt.Policy.Allow, "deny": u.opt.Policy.Deny,
		"jetstream": u.opt.JetStream,
	})
}

func builtinDeny(prefix string) []string {
	var out []string
	for _, r := range envelope.BuiltinDeny(prefix) {
		out = append(out, r.Name+" ("+r.Why+")")
	}
	return out
}

func (u *UI) cancel(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ID == "" {
		http.Error(w, `body must be {"id": "..."}`, http.StatusBadRequest)
		return
	}
	c, err := u.st.Cancel(r.Context(), req.ID)
	if err != nil {
		u.unavailable(w, err)
		return
	}
	u.log.Info("cancelled from the console", "id", req.ID, "existed", c.Existed, "in_flight", c.InFlight)
	writeJSON(w, map[string]any{"id": req.ID, "cancelled": c.Existed, "in_flight": c.InFlight})
}

func (u *UI) dead(act func(context.Context, []string) (int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			IDs []string `json:"ids"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.IDs) == 0 || len(req.IDs) > 1000 {
			http.Error(w, `body must be {"ids": [...]} with 1 to 1000 ids`, http.StatusBadRequest)
			return
		}
		n, err := act(r.Context(), req.IDs)
		if err != nil {
			u.unavailable(w, err)
			return
		}
		u.log.Info("dead envelopes handled from the console", "path", r.URL.Path, "count", n)
		writeJSON(w, map[string]any{"count": n})
	}
}

func (u *UI) unavailable(w http.ResponseWriter, err error) {
	u.log.Warn("console request failed", "error", err)
	http.Error(w, "store unavailable", http.StatusServiceUnavailable)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// consoleTime is a time as the console shows it: RFC 3339 in UTC with
// exactly three fraction digits, so every due time in a column has one
// width (RFC 3339 nano drops trailing zeros).
func consoleTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}
