package store

import (
	"hash/fnv"
	"strconv"
)

// shardKeys are the Redis keys of one shard. They share the hash tag
// "{<ns>:<shard>}" so that every script touches a single Cluster slot.
type shardKeys struct {
	due      string // ZSET id → due ms
	inflight string // ZSET id → lease expiry ms
	data     string // HASH id → encoded envelope
	// attempts: HASH id → "n" or "n/b": n attempts were counted before the
	// current lease, b of them before the envelope's last replay (b only
	// when > 0); only for n > 0. The Lua calls it "claims".
	attempts string
	dead     string // ZSET id → time of death ms
	errors   string // HASH id → last delivery error, while retrying or dead
	// lease keeps the claim tokens unique: per lease length in use
	// (ms) its class and the newest token handed out, "class:token",
	// token as an integer, lease expiry ms × 1000 + k (scripts.go).
	lease string // HASH
	// seen remembers the intake stream's messages the shard stored, for
	// the stream's redelivery horizon: "<stream seq>@<publish time ns>" →
	// expiry ms. A redelivery of a message already stored is not stored
	// again.
	seen  string // ZSET
	owner string // STRING id of the daemon scanning the shard, with a TTL
	// fence is written (with a 60 s TTL) before a WAIT that follows
	// scripts that may have written nothing (wait.go).
	fence string // STRING
}

func keysFor(ns string, shard int) shardKeys {
	tag := "{" + ns + ":" + strconv.Itoa(shard) + "}:"
	return shardKeys{
		due:      tag + "due",
		inflight: tag + "inflight",
		data:     tag + "data",
		attempts: tag + "attempts",
		dead:     tag + "dead",
		errors:   tag + "errors",
		lease:    tag + "lease",
		seen:     tag + "seen",
		owner:    tag + "owner",
		fence:    tag + "fence",
	}
}

// membersKey is the ZSET of live daemons (id → heartbeat expiry ms). Its
// hash tag starts like the shards' so an ACL key pattern on "{<ns>:" covers
// everything delayd touches.
func membersKey(ns string) string { return "{" + ns + ":members}" }

// list returns the keys in the order every script expects them in KEYS.
func (k shardKeys) list() []string {
	return []string{k.due, k.inflight, k.data, k.attempts, k.dead, k.errors, k.lease, k.seen}
}

// ShardOf maps an id to its shard. FNV-1a is stable across versions and
// languages, so the mapping never changes for stored data.
func ShardOf(id string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}
