package client

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go"
)

// The operator endpoints live under <prefix>.admin.>, apart from the
// publisher's, so that NATS permissions tell the two roles apart: a
// publisher is usually refused there (no responders, or a permission
// error). Their times are RFC 3339 strings as the daemon writes them.

// Entry describes one stored envelope.
type Entry struct {
	ID string `json:"id"`
	// State is pending, paused (pending, held by a pause of its target:
	// Due is its own due time), inflight or dead.
	State string `json:"state"`
	// Due is the due time when pending, the lease expiry when inflight,
	// the time of death when dead.
	Due      string              `json:"due"`
	Target   string              `json:"target"`
	Size     int                 `json:"size"`
	Attempts int                 `json:"attempts"`
	Shard    int                 `json:"shard"`
	Error    string              `json:"error,omitempty"`
	Header   map[string][]string `json:"headers,omitempty"`
	// Series is the rule of a recurring series (e.g. "cron 0 30 2 * * *
	// in Europe/Berlin"), empty for a one-shot; Occurrence is the number
	// of the occurrence that Due belongs to, from 1.
	Series     string `json:"series,omitempty"`
	Occurrence int64  `json:"occurrence,omitempty"`
}

// ListRequest selects one page of List.
type ListRequest struct {
	Target    string `json:"target,omitempty"`     // subject pattern, filters each page
	DueBefore string `json:"due_before,omitempty"` // RFC 3339
	Limit     int    `json:"limit,omitempty"`      // 1..1000, default 100
	Cursor    string `json:"cursor,omitempty"`     // a previous page's Next
	Dead      bool   `json:"dead,omitempty"`       // the dead set instead of pending
}

// Page is one page in due order across shards (ties by id); Next is the
// cursor of the next page, empty on the last page.
type Page struct {
	Entries []Entry `json:"entries"`
	Next    string  `json:"next,omitempty"`
}

// ShardStats is one shard's sizes.
type ShardStats struct {
	Shard    int    `json:"shard"`
	Pending  int64  `json:"pending"`
	Inflight int64  `json:"inflight"`
	Dead     int64  `json:"dead"`
	NextDue  string `json:"next_due,omitempty"`
}

// Stats is the whole delay set at a glance. Pending counts the envelopes
// flow control holds too; Flow says how many.
type Stats struct {
	Now      string       `json:"now"`
	Pending  int64        `json:"pending"`
	Inflight int64        `json:"inflight"`
	Dead     int64        `json:"dead"`
	NextDue  string       `json:"next_due,omitempty"`
	Shards   []ShardStats `json:"shards"`
	Flow     []FlowRule   `json:"flow,omitempty"`
}

// FlowRule is the flow control of one target pattern, fleet-wide: its rate
// limit, its pause, and what they hold back.
type FlowRule struct {
	Pattern string `json:"pattern"`
	// Rate is the limit ("500/s"), empty without one; Burst its burst.
	Rate  string `json:"rate,omitempty"`
	Burst int    `json:"burst,omitempty"`
	// PausedSince is when its pause began (RFC 3339), empty when not
	// paused.
	PausedSince string `json:"paused_since,omitempty"`
	// Limited counts the envelopes waiting for a slot of the limit, Parked
	// those its pause holds (an upper bound: one cancelled meanwhile counts
	// until the resume).
	Limited int64 `json:"limited"`
	Parked  int64 `json:"parked"`
	// DrainSeconds is how long the limit's held envelopes take to go out.
	DrainSeconds float64 `json:"drain_seconds"`
	// CurrentRate is how many deliveries the limit let go in the last whole
	// second.
	CurrentRate int64 `json:"current_rate"`
}

// LimitRequest sets a rate limit (Rate "500/s", "30/m" or "10/h"; Burst 0
// means 1), or removes it (Rate "off").
type LimitRequest struct {
	Pattern string `json:"pattern"`
	Rate    string `json:"rate"`
	Burst   int    `json:"burst,omitempty"`
}

// FlowChange is the answer to a change of flow control: the rule as it is
// now (answered once every live daemon holds it), whether there was one to
// remove (removing a limit, resuming), and how many held envelopes it
// released, due now.
type FlowChange struct {
	Rule     FlowRule `json:"rule"`
	Existed  bool     `json:"existed,omitempty"`
	Released int      `json:"released,omitempty"`
}

// DeadSelection picks dead envelopes to replay or purge: the listed IDs,
// or All of them.
type DeadSelection struct {
	IDs []string `json:"ids,omitempty"`
	All bool     `json:"all,omitempty"`
}

// DeadResult says how many dead envelopes were replayed or purged; More
// says that All stopped at the per-call bound: call again.
type DeadResult struct {
	Count int  `json:"count"`
	More  bool `json:"more,omitempty"`
}

// Get returns what is stored under id, or an error matching ErrNotFound.
// Header values the daemon redacts come back as REDACTED.
func (c *Client) Get(ctx context.Context, id string) (Entry, error) {
	if id == "" {
		return Entry{}, badRequest("get", "empty id")
	}
	var out Entry
	err := c.request(ctx, "admin.get", "", &nats.Msg{Header: nats.Header{headerID: []string{id}}}, &out)
	return out, err
}

// List returns one page of stored (or dead) envelopes.
func (c *Client) List(ctx context.Context, r ListRequest) (Page, error) {
	var out Page
	err := c.adminJSON(ctx, "list", r, &out)
	return out, err
}

// Stats returns the sizes of the delay set, per shard and in total.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var out Stats
	err := c.request(ctx, "admin.stats", "", &nats.Msg{}, &out)
	return out, err
}

// Replay schedules the selected dead envelopes again, due now.
func (c *Client) Replay(ctx context.Context, sel DeadSelection) (DeadResult, error) {
	var out DeadResult
	err := c.adminJSON(ctx, "replay", sel, &out)
	return out, err
}

// Purge deletes the selected dead envelopes.
func (c *Client) Purge(ctx context.Context, sel DeadSelection) (DeadResult, error) {
	var out DeadResult
	err := c.adminJSON(ctx, "purge", sel, &out)
	return out, err
}

// SetLimit limits deliveries to targets matching pattern, fleet-wide, to
// rate ("500/s", "30/m", "10/h") after a burst (0: 1). Envelopes of those
// targets go out in due order at no more than the rate, never early; one
// held is not an attempt.
func (c *Client) SetLimit(ctx context.Context, pattern, rate string, burst int) (FlowChange, error) {
	var out FlowChange
	err := c.adminJSON(ctx, "limit", LimitRequest{Pattern: pattern, Rate: rate, Burst: burst}, &out)
	return out, err
}

// RemoveLimit removes the limit on pattern; what it held is due now.
func (c *Client) RemoveLimit(ctx context.Context, pattern string) (FlowChange, error) {
	var out FlowChange
	err := c.adminJSON(ctx, "limit", LimitRequest{Pattern: pattern, Rate: "off"}, &out)
	return out, err
}

// Limits lists the fleet's flow-control rules: limits and pauses.
func (c *Client) Limits(ctx context.Context) ([]FlowRule, error) {
	var out []FlowRule
	err := c.request(ctx, "admin.limits", "", &nats.Msg{}, &out)
	return out, err
}

// Pause holds every delivery to targets matching pattern, fleet-wide,
// until Resume: the envelopes stay pending, cancellable and visible.
func (c *Client) Pause(ctx context.Context, pattern string) (FlowChange, error) {
	var out FlowChange
	err := c.adminJSON(ctx, "pause", struct {
		Pattern string `json:"pattern"`
	}{pattern}, &out)
	return out, err
}

// Resume ends the pause of pattern: what it held goes out in due order,
// under any limit, with the attempt it had.
func (c *Client) Resume(ctx context.Context, pattern string) (FlowChange, error) {
	var out FlowChange
	err := c.adminJSON(ctx, "resume", struct {
		Pattern string `json:"pattern"`
	}{pattern}, &out)
	return out, err
}

func (c *Client) adminJSON(ctx context.Context, verb string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return badRequest("admin."+verb, "%v", err)
	}
	return c.request(ctx, "admin."+verb, "", &nats.Msg{Data: b}, out)
}
