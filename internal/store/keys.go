package store

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// shardKeys are the Redis keys of one shard. They share the hash tag
// "{<ns>:<shard>}" so that every script touches a single Cluster slot. The
// shard scripts (lua/) get the first nine in KEYS, in the order of list,
// and name them as the fields are named here.
//
// Invariants of one shard's keys (checked by Check and the model test):
//   - every data entry is in exactly one of due, inflight, dead;
//   - every due, inflight or dead member has a data entry;
//   - every inflight score is a claim token (inflight);
//   - attempts and errors entries exist only beside data;
//   - the counted attempts n never go down, except that a replace starts
//     them over (a new version), and b <= n;
//   - no two claims of a shard ever had the same token (lease).
//
// Every script keeps them within one call; lua/prelude.lua says what a
// script that stops part-way can leave, for Check to find and repair.
type shardKeys struct {
	due string // ZSET id → due ms (whole milliseconds)
	// inflight: ZSET id → the claim's token, its lease score: a whole
	// number, lease expiry ms × 1000 + k, never a multiple of 1000 (a
	// listpack integer, which Redis compares without parsing). A settle
	// names that score, so a stale daemon whose lease expired, or whose
	// envelope was replaced or cancelled meanwhile, changes nothing. (The
	// retired formats 1 and 2 wrote the expiry in ms, whole or plus a
	// fraction k/1000: below 1e14, schema.go.)
	inflight string
	// data: HASH id → the stored value: a header with the original due
	// time (and, for a series, the pending occurrence), then the encoded
	// envelope (value.go).
	data string
	// attempts: HASH id → "n" or "n/b": n attempts were counted before the
	// current lease, b of them before the envelope's last replay (b only
	// when > 0), for ids with n > 0 only: a first delivery writes nothing
	// there. An envelope's attempt number is n + 1 and only goes up; a
	// replay grants a fresh budget of tries by setting b = n. (Check calls
	// an entry without data "claim_without_data", a name kept for its
	// users.)
	attempts string
	dead     string // ZSET id → time of death ms
	errors   string // HASH id → last delivery error, while retrying or dead
	// lease keeps the claim tokens unique: HASH lease length in use (ms) →
	// "class:token", its class and the newest token handed out for it. As
	// an integer a token is expiry ms × 1000 + k, and tokens never repeat
	// within a shard, so two claims of one id can never share one, however
	// close in time (a replace and its re-claim within one millisecond).
	// The class is the token's residue mod 8: each claim takes a token of
	// its class above the newest of the class, and lengths of different
	// classes cannot meet. Tokens of one length grow with time; those of
	// two lengths could end in the same millisecond, which the classes keep
	// apart. With more than 8 lengths in use at once (daemons configured
	// differently), two share a class, and a shorter lease may then end as
	// late as the longer one: late, never early.
	lease string
	// seen remembers the intake stream's messages the shard stored, for
	// the stream's redelivery horizon: ZSET "<stream seq>@<publish time
	// ns>" → expiry ms. A redelivery of a message already stored is not
	// stored again.
	seen string
	// done holds the tombstones of delivered ids whose request is
	// remembered (Store's dedupe window): ZSET "<fingerprint><id>" → the
	// due ms the id had. The 8 bytes of the request's fingerprint come
	// first, so a resend finds its own tombstone with one ZSCORE. Kept
	// until the due time + the window; a resend of the same request then
	// is answered with that due time and stores nothing.
	done  string
	owner string // STRING id of the daemon scanning the shard, with a TTL
	// fence is written (with a 60 s TTL) before a WAIT that follows
	// scripts that may have written nothing (wait.go).
	fence string // STRING
	// pending indexed the due buckets of the retired format 4
	// (schema.go): read only by delayd doctor and migrate.
	pending string
	// all is list's answer, built once: every script call passes it.
	all []string
	// tag is the prefix of every key of the shard, "{<ns>:<shard>}:": the
	// scripts that take several shards a call (claim, ack) name each
	// shard's keys from it, as keysFor does.
	tag string
}

// leaseEnd is the lease expiry in ms of a lease score.
func leaseEnd(score float64) int64 { return int64(score) / 1000 }

func keysFor(ns string, shard int) shardKeys {
	tag := "{" + ns + ":" + strconv.Itoa(shard) + "}:"
	k := shardKeys{
		tag:      tag,
		due:      tag + "due",
		inflight: tag + "inflight",
		data:     tag + "data",
		attempts: tag + "attempts",
		dead:     tag + "dead",
		errors:   tag + "errors",
		lease:    tag + "lease",
		seen:     tag + "seen",
		done:     tag + "done",
		owner:    tag + "owner",
		fence:    tag + "fence",
		pending:  tag + "pending",
	}
	k.all = []string{k.due, k.inflight, k.data, k.attempts, k.dead, k.errors, k.lease, k.seen, k.done}
	return k
}

// membersKey is the ZSET of live daemons (id → heartbeat expiry ms). Its
// hash tag starts like the shards' so an ACL key pattern on "{<ns>:" covers
// everything delayd touches.
func membersKey(ns string) string { return "{" + ns + ":members}" }

// flowKey is the HASH of the fleet's flow-control rules (flow.go); the
// keys of each rule share its hash tag: flowKey + ":<kind>:<pattern>".
func flowKey(ns string) string { return "{" + ns + ":flow}" }

// inNamespace reports whether key is one of namespace ns's (keys.go): a
// shard's "{<ns>:<shard>}:<name>", the member list "{<ns>:members}" and
// what follows it ("{<ns>:members}:formats"), or the flow rules
// "{<ns>:flow}" and theirs.
func inNamespace(key, ns string) bool {
	rest, ok := strings.CutPrefix(key, "{"+ns+":")
	if !ok {
		return false
	}
	if strings.HasPrefix(rest, "members}") || strings.HasPrefix(rest, "flow}") {
		return true
	}
	shard, _, ok := strings.Cut(rest, "}:")
	if !ok || shard == "" {
		return false
	}
	for _, r := range shard {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// list returns the keys in the order every shard script expects them in
// KEYS (lua/prelude.lua's kinds, script.go's keyKinds). The slice is
// shared: callers must not change it.
func (k shardKeys) list() []string { return k.all }

// ShardOf maps an id to its shard. FNV-1a is stable across versions and
// languages, so the mapping never changes for stored data.
func ShardOf(id string, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}
