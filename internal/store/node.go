package store

// Calls per Redis node: the claim and the ack take every shard of a node
// in one script call.

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// byNode groups shards (by their index in shards) by the Redis node that
// holds them: all in one group on a single Redis (or Sentinel's master);
// under Cluster one group per master, from the client's slot map (no round
// trip), or a group of one where the map does not know the slot.
func (s *Store) byNode(ctx context.Context, shards []int) [][]int {
	if len(shards) == 0 {
		return nil
	}
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		all := make([]int, len(shards))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	at := map[string]int{}
	var out [][]int
	for i, sh := range shards {
		node, err := cc.MasterForKey(ctx, s.keys[sh].due)
		if err != nil {
			out = append(out, []int{i})
			continue
		}
		g, ok := at[node.Options().Addr]
		if !ok {
			g = len(out)
			at[node.Options().Addr] = g
			out = append(out, nil)
		}
		out[g] = append(out[g], i)
	}
	return out
}

// notOnThisNode: err is Redis Cluster's refusal of a call of several
// shards whose slots are not all served by the node it reached (one moved,
// or is moving). Such a call wrote nothing: the scripts that take several
// shards read every shard before they write any.
func notOnThisNode(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, m := range []string{"non local key", "MOVED ", "ASK ", "TRYAGAIN", "CROSSSLOT"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// execByNode runs op with one call per group of parts (build makes a
// group's call: one node's shards, node.go's byNode). A call of several
// shards that wrote nothing (Cluster refused it, a slot moving, or one
// shard's key is of the wrong type: the scripts read every shard before
// they write any) goes again as one call per part, so one shard cannot
// hold up the others of its node. It returns the groups, those split
// nil, and their results, and the first error of a call that did not
// run.
func execByNode[R any, A scriptCall[R], P any](ctx context.Context, s *Store, op string, groups [][]P,
	build func([]P) A) ([][]P, []result[R], error) {
	calls := make([]A, len(groups))
	for g, group := range groups {
		calls[g] = build(group)
	}
	res, err := exec(ctx, s, op, calls)
	var again [][]P
	for g, r := range res {
		if !r.ran && len(groups[g]) > 1 && (errors.Is(r.err, ErrNotWritten) || notOnThisNode(r.err)) {
			for _, p := range groups[g] {
				again = append(again, []P{p})
			}
			groups[g] = nil
		}
	}
	if len(again) == 0 {
		return groups, res, err
	}
	calls = calls[:0]
	for _, group := range again {
		calls = append(calls, build(group))
	}
	var more []result[R]
	if s.cluster {
		// One at a time: the Cluster client sends again every command of
		// a node's pipeline when one of them fails (TRYAGAIN while a slot
		// moves), and a claim sent again hands out nothing (the first run
		// leased its envelopes, and its reply is lost).
		for _, c := range calls {
			r, _ := exec(ctx, s, op, []A{c})
			more = append(more, r...)
		}
	} else {
		more, _ = exec(ctx, s, op, calls)
	}
	groups, res, err = append(groups, again...), append(res, more...), nil
	for g, r := range res {
		if groups[g] != nil && !r.ran && err == nil {
			err = r.err
		}
	}
	return groups, res, err
}
