package store

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// shardKeys are the Redis keys of one shard. They share the hash tag
// "{<ns>:<shard>}" so that every script touches a single Cluster slot. The
// shard scripts (lua/) get the first ten in KEYS, in the order of list,
// and name them as the fields are named here.
//
// Invariants of one shard's keys (checked by Check and the model test):
//   - every data entry is in exactly one of due, a bucket of pending,
//     inflight, dead (an envelope is pending in due or in its bucket);
//   - every due, bucket, inflight or dead member has a data entry;
//   - a bucket's entries are due in its range, more than bucketMax + 1
//     only when due in one ms, and pending's count is their number
//     (pending, below);
//   - every inflight score is a claim token (inflight);
//   - attempts and errors entries exist only beside data;
//   - the counted attempts n never go down, except that a replace starts
//     them over (a new version), and b <= n;
//   - no two claims of a shard ever had the same token (lease).
//
// Every script keeps them within one call; lua/prelude.lua says what a
// script that stops part-way can leave, for Check to find and repair.
type shardKeys struct {
	due string // ZSET id → due ms (whole milliseconds); see pending
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
	// pending indexes the due buckets (format 4, FormatDueBuckets, which
	// the fleet writes only with redis.due_buckets on every daemon), small
	// sorted sets that hold the pending envelopes scheduled since the fleet
	// writes format 4, at ~30 bytes an entry instead of the ~125 of an
	// entry of due (a listpack instead of a hash table entry and a skiplist
	// node): ZSET "<bound>" → bound, the due ms a bucket starts at. The
	// bucket's key is pending + ":" + its bound: ZSET id → due ms (the
	// value header's), for the due times from its bound up to the next
	// bucket's. A bucket past bucketMax entries splits at a due time (never
	// inside one ms), so it stays a listpack under Redis' default
	// zset-max-listpack-entries of 128, unless more than that are due in
	// one ms in the shard, or its ids are over 64 bytes: then a skiplist,
	// correct, only as large as due. An empty bucket is dropped, and an
	// entry below every bucket moves the first one's bound down. So a
	// script finds an id's bucket from its due time alone, and claims the
	// earliest by reading the first buckets. Bucket keys are named in the
	// scripts after pending, in its hash tag's slot, not passed in KEYS
	// (docs/architecture.md says why). pending + "#" (STRING) counts the
	// buckets' entries, for Stats. The due set keeps what older daemons
	// wrote and whatever goes pending again at another time than its value
	// header's (retry, postpone, replay, a series' next occurrence, a newer
	// format given back): every script reads both, and claims in (due, id)
	// order across them.
	pending string
	// all is list's answer, built once: every script call passes it.
	all []string
}

// leaseEnd is the lease expiry in ms of a lease score.
func leaseEnd(score float64) int64 { return int64(score) / 1000 }

func keysFor(ns string, shard int) shardKeys {
	tag := "{" + ns + ":" + strconv.Itoa(shard) + "}:"
	k := shardKeys{
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
	k.all = []string{k.due, k.inflight, k.data, k.attempts, k.dead, k.errors, k.lease, k.seen, k.done, k.pending}
	return k
}

// membersKey is the ZSET of live daemons (id → heartbeat expiry ms). Its
// hash tag starts like the shards' so an ACL key pattern on "{<ns>:" covers
// everything delayd touches.
func membersKey(ns string) string { return "{" + ns + ":members}" }

// inNamespace reports whether key is one of namespace ns's (keys.go): a
// shard's "{<ns>:<shard>}:<name>", or the member list "{<ns>:members}"
// and what follows it ("{<ns>:members}:formats").
func inNamespace(key, ns string) bool {
	rest, ok := strings.CutPrefix(key, "{"+ns+":")
	if !ok {
		return false
	}
	if strings.HasPrefix(rest, "members}") {
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

// bucketMax is the most entries a due bucket keeps before it splits, as
// in lua/prelude.lua (tests compare).
const bucketMax = 120
