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
	ID    string `json:"id"`
	State string `json:"state"` // pending, inflight or dead
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

// Stats is the whole delay set at a glance.
type Stats struct {
	Now      string       `json:"now"`
	Pending  int64        `json:"pending"`
	Inflight int64        `json:"inflight"`
	Dead     int64        `json:"dead"`
	NextDue  string       `json:"next_due,omitempty"`
	Shards   []ShardStats `json:"shards"`
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

func (c *Client) adminJSON(ctx context.Context, verb string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return badRequest("admin."+verb, "%v", err)
	}
	return c.request(ctx, "admin."+verb, "", &nats.Msg{Data: b}, out)
}
