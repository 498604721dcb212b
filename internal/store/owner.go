package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Shard ownership: with many daemons on one Redis, each shard is scanned by
// one owner at a time. Ownership is a lease: the key {<ns>:<shard>}:owner
// holds the owner's id with a TTL, renewed while the owner lives. Members
// announce themselves with a heartbeat in the {<ns>:members} ZSET (id →
// expiry ms), so every daemon sees the same live set and computes the same
// fair assignment.

// Heartbeat marks id alive for ttl and returns the live members (sorted)
// and Redis' time. A ttl of 0 removes id: a graceful leave.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) ([]string, int64, error) {
	r := exec1(ctx, s, heartbeatOp, heartbeatArgs{set: membersKey(s.ns), member: id, ttlMs: ttl.Milliseconds()})
	reply, err := r.reply, r.err
	if err != nil {
		s.failed(err)
		return nil, 0, fmt.Errorf("store: heartbeat: %w", err)
	}
	return reply.members, reply.nowMs, nil
}

// Own holds the shards in hold and releases those in release, for id, in
// one pipeline. It returns which of hold id owns afterwards.
func (s *Store) Own(ctx context.Context, id string, ttl time.Duration, hold, release []int) ([]bool, error) {
	n := len(hold) + len(release)
	if n == 0 {
		return nil, nil
	}
	calls := make([]ownArgs, 0, n)
	for _, sh := range hold {
		calls = append(calls, ownArgs{owner: s.keys[sh].owner, id: id, ttlMs: ttl.Milliseconds()})
	}
	for _, sh := range release {
		calls = append(calls, ownArgs{owner: s.keys[sh].owner, id: id, ttlMs: ttl.Milliseconds(), release: true})
	}
	res, err := exec(ctx, s, ownOp, calls)
	if err != nil {
		return nil, fmt.Errorf("store: own: %w", err)
	}
	owned := make([]bool, len(hold))
	for i := range hold {
		owned[i] = res[i].reply.owned
	}
	return owned, nil
}

// Owners returns the current owner id of every shard ("" when none).
func (s *Store) Owners(ctx context.Context) ([]string, error) {
	keys := make([]string, s.shards)
	for i := range keys {
		keys[i] = s.keys[i].owner
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, s.shards)
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]string, s.shards)
	for i, c := range cmds {
		if err := c.Err(); err != nil && err != redis.Nil {
			return nil, fmt.Errorf("store: owners: %w", err)
		}
		out[i] = c.Val()
	}
	return out, nil
}

// formatsKey is the ZSET of every live daemon's newest readable format,
// "<format>:<daemon id>" → expiry ms: intake-only daemons announce there
// too, as they write values, while only scanners are members.
func formatsKey(ns string) string { return membersKey(ns) + ":formats" }

// AgreeFormats announces the newest format daemon id reads, for ttl (0:
// leave), and sets the format this store writes to the newest one that
// every live daemon reads, at least FormatIntegerLeases: the formats
// before it are retired (value.go), and a build that announces one, or
// none, cannot run beside this version (docs/operations.md, Upgrading).
// It returns the format written from now on.
func (s *Store) AgreeFormats(ctx context.Context, id string, ttl time.Duration) (int, error) {
	me := strconv.Itoa(s.newest) + ":" + id
	// The heartbeat's script: a ZSET of announcements with their expiry.
	r := exec1(ctx, s, formatsOp, heartbeatArgs{set: formatsKey(s.ns), member: me, ttlMs: ttl.Milliseconds()})
	reply, err := r.reply, r.err
	if err != nil {
		s.failed(err)
		return int(s.write.Load()), fmt.Errorf("store: announce formats: %w", err)
	}
	if ttl == 0 {
		return int(s.write.Load()), nil
	}
	w := s.newest
	for _, v := range reply.members {
		f, _, _ := strings.Cut(v, ":")
		if n, err := strconv.Atoi(f); err == nil {
			w = min(w, max(n, FormatIntegerLeases))
		}
	}
	s.write.Store(int32(w))
	return w, nil
}

// RunFormats keeps this daemon's announcement fresh every third of ttl
// until ctx is done, then withdraws it. It logs each change of the
// format the fleet writes.
func (s *Store) RunFormats(ctx context.Context, id string, ttl time.Duration, log hclog.Logger) error {
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	last, failing := 0, false
	for {
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		w, err := s.AgreeFormats(rctx, id, ttl)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			log.Warn("announcing the stored formats failed; writing the last agreed one", "format", w, "error", err)
			failing = true
		case err == nil:
			failing = false
			if w != last {
				log.Info("stored format agreed with every live daemon", "writes", w, "reads up to", s.newest)
				last = w
			}
		}
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = s.AgreeFormats(lctx, id, 0)
			cancel()
			return nil
		case <-t.C:
		}
	}
}
