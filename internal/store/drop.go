package store

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// DropNamespace deletes every key of namespace ns: its shards' keys and its
// member list, whatever its shard count. It is for a namespace nobody uses
// any more (what `delayd bench --local` gave its child), never for a live
// one: a daemon still running there writes its keys again.
func DropNamespace(ctx context.Context, rdb redis.UniversalClient, ns string) (int, error) {
	// Every key delayd writes starts with "{<ns>:" (keys.go).
	match := globEscape("{"+ns+":") + "*"
	var n atomic.Int64 // ForEachMaster runs drop on every master at once
	drop := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, 500).Result()
			if err != nil {
				return err
			}
			// One DEL per key: under Cluster, keys of several shards
			// hash to several slots.
			for _, k := range keys {
				if !inNamespace(k, ns) {
					continue // "{<ns>:eu:0}:due" is namespace "<ns>:eu"'s
				}
				if err := c.Del(ctx, k).Err(); err != nil {
					return err
				}
				n.Add(1)
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, drop)
	case *redis.Client:
		err = drop(ctx, c)
	default:
		err = fmt.Errorf("store: cannot scan a %T", rdb)
	}
	if err != nil {
		return int(n.Load()), fmt.Errorf("store: dropping namespace %q: %w", ns, err)
	}
	return int(n.Load()), nil
}

// globEscape escapes the characters SCAN's MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
