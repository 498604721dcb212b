package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// Inspector is what the inspection endpoints read.
type Inspector interface {
	Get(ctx context.Context, id string) (store.Entry, error)
	List(ctx context.Context, o store.ListOptions) ([]store.Entry, store.Cursor, bool, error)
	Stats(ctx context.Context, shards ...int) ([]store.ShardStats, int64, error)
	Replay(ctx context.Context, ids []string) (int, error)
	Purge(ctx context.Context, ids []string) (int, error)
}

// maxListLimit bounds one page, so one call never reads much of Redis.
const maxListLimit = 1000

func (in *Intake) addInspect(g micro.Group) error {
	for name, h := range map[string]micro.HandlerFunc{
		"get": in.handleGet, "list": in.handleList, "stats": in.handleStats,
		"replay": in.deadHandler("replay", in.insp.Replay), "purge": in.deadHandler("purge", in.insp.Purge),
	} {
		if err := g.AddEndpoint(name, h); err != nil {
			return err
		}
	}
	return nil
}

func (in *Intake) handleGet(req micro.Request) {
	id, err := envelope.ParseID(req.Headers(), in.opt.Limits)
	if err != nil {
		in.reject(now(req), err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.opt.storeTimeout)
	defer cancel()
	e, err := in.insp.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		in.fail(now(req), 404, "no envelope with id "+id)
	case err != nil:
		in.log.Error("get failed", "id", id, "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
	default:
		info := entryInfo(e, true)
		info.Header = envelope.RedactHeaders(info.Header, in.opt.RedactHeaders)
		in.respond(now(req), info)
	}
}

func (in *Intake) handleList(req micro.Request) {
	var r client.ListRequest
	if len(req.Data()) > 0 {
		if err := json.Unmarshal(req.Data(), &r); err != nil {
			in.fail(now(req), envelope.CodeBadRequest, "list body must be JSON: "+err.Error())
			return
		}
	}
	o := store.ListOptions{Limit: r.Limit, State: store.StatePending}
	if r.Dead {
		o.State = store.StateDead
	}
	switch {
	case o.Limit == 0:
		o.Limit = 100
	case o.Limit < 0 || o.Limit > maxListLimit:
		in.fail(now(req), envelope.CodeBadRequest, fmt.Sprintf("limit must be 1..%d, got %d", maxListLimit, o.Limit))
		return
	}
	if r.DueBefore != "" {
		t, err := time.Parse(time.RFC3339Nano, r.DueBefore)
		if err != nil {
			in.fail(now(req), envelope.CodeBadRequest, "due_before is not an RFC 3339 time")
			return
		}
		o.DueBefore = t.UnixMilli()
	}
	if r.Target != "" && !envelope.ValidPattern(r.Target) {
		in.fail(now(req), envelope.CodeBadRequest, "target is not a subject pattern")
		return
	}
	var err error
	if o.Cursor, err = store.ParseCursor(r.Cursor); err != nil {
		in.fail(now(req), envelope.CodeBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.opt.storeTimeout)
	defer cancel()
	entries, next, done, err := in.insp.List(ctx, o)
	if err != nil {
		in.log.Error("list failed", "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
		return
	}
	out := client.Page{Entries: []client.Entry{}}
	for _, e := range entries {
		info := entryInfo(e, false)
		if r.Target == "" || envelope.Match(r.Target, info.Target) {
			out.Entries = append(out.Entries, info)
		}
	}
	if !done {
		out.Next = next.String()
	}
	in.respond(now(req), out)
}

func (in *Intake) handleStats(req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), in.opt.storeTimeout)
	defer cancel()
	shards, nowMs, err := in.insp.Stats(ctx)
	if err != nil {
		in.log.Error("stats failed", "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
		return
	}
	out := client.Stats{Now: envelope.FormatMs(nowMs), Shards: make([]client.ShardStats, len(shards))}
	next := int64(-1)
	for i, s := range shards {
		out.Pending += s.Counts.Pending
		out.Inflight += s.Counts.Inflight
		out.Dead += s.Counts.Dead
		out.Shards[i] = client.ShardStats{Shard: s.Shard, Pending: s.Counts.Pending, Inflight: s.Counts.Inflight, Dead: s.Counts.Dead}
		if s.NextDueMs >= 0 {
			out.Shards[i].NextDue = envelope.FormatMs(s.NextDueMs)
			if next < 0 || s.NextDueMs < next {
				next = s.NextDueMs
			}
		}
	}
	if next >= 0 {
		out.NextDue = envelope.FormatMs(next)
	}
	if out.Flow, err = in.flowRules(ctx); err != nil {
		in.log.Error("stats failed", "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
		return
	}
	in.respond(now(req), out)
}

// maxDeadBatch bounds how many dead envelopes one replay or purge call
// with All handles, so one request never holds Redis for long.
const maxDeadBatch = 10000

// deadHandler serves replay and purge: act on the listed ids or, with All,
// on the dead set page by page.
func (in *Intake) deadHandler(verb string, act func(context.Context, []string) (int, error)) micro.HandlerFunc {
	return func(req micro.Request) {
		var r client.DeadSelection
		if err := json.Unmarshal(req.Data(), &r); err != nil || (len(r.IDs) == 0) == !r.All {
			in.fail(now(req), envelope.CodeBadRequest, verb+` body must be {"ids": [...]} or {"all": true}`)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*in.opt.storeTimeout)
		defer cancel()
		var out client.DeadResult
		ids := r.IDs
		for {
			if r.All {
				// Always the first page: what was acted on left the set.
				page, _, _, err := in.insp.List(ctx, store.ListOptions{State: store.StateDead, Limit: maxListLimit})
				if err != nil {
					in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
					return
				}
				ids = ids[:0]
				for _, e := range page {
					ids = append(ids, e.ID)
				}
			}
			if len(ids) == 0 {
				break
			}
			n, err := act(ctx, ids)
			if err != nil {
				in.log.Error(verb+" failed", "error", err)
				in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
				return
			}
			out.Count += n
			if !r.All || n == 0 {
				break
			}
			if out.Count >= maxDeadBatch {
				out.More = true
				break
			}
		}
		in.log.Info("dead envelopes handled", "action", verb, "count", out.Count)
		in.respond(now(req), out)
	}
}

func entryInfo(e store.Entry, withHeaders bool) client.Entry {
	info := client.Entry{ID: e.ID, State: string(e.State), Due: envelope.FormatMs(e.DueMs), Attempts: e.Attempts, Shard: e.Shard, Error: e.Error}
	if env, err := envelope.Decode(e.Data); err == nil {
		info.Target, info.Size = env.Target, len(env.Payload)
		if env.Series != nil {
			info.Series, info.Occurrence = env.Series.String(), e.Occurrence
		}
		if withHeaders {
			info.Header = env.Header
		}
	} else {
		info.Target = "(undecodable)"
	}
	return info
}

// respond sends a JSON reply, if the request has a reply subject.
func (in *Intake) respond(reply answer, v any) {
	if reply.subject == "" {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		in.fail(reply, 500, "encoding reply: "+err.Error())
		return
	}
	if reply.req != nil {
		err = reply.req.Respond(b)
	} else {
		err = in.nc.Publish(reply.subject, b)
	}
	if err != nil {
		in.log.Warn("reply failed", "error", err)
	}
}
