package store

// The retired stored formats (value.go): how a daemon knows at start
// that a namespace holds none, and how delayd migrate moves them.
//
// The schema key, {<ns>:members}:schema (STRING), holds the oldest stored
// format the namespace may hold: "3". It is written by the first start of
// this version on an empty namespace, by a start that scanned a small
// namespace and found nothing older, and by delayd migrate once it moved
// everything; a start then reads that one key. A namespace with data and
// no key was written by a build before this version: checked entry by
// entry when small (startScanMax), refused otherwise, naming delayd
// migrate. The scripts read format 3 only, so that nothing they meet is
// older: a bare value would be handed out without a due time, and a lease
// score of format 1 or 2 (expiry ms, below legacyScore) would be re-leased
// at once, as a token that ended in 1973.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// schemaKey is the namespace's record of the oldest stored format its
// data may hold.
func schemaKey(ns string) string { return membersKey(ns) + ":schema" }

// legacyScore parts the lease scores: the retired formats wrote the lease
// expiry in ms (whole in format 1, plus a fraction in format 2), below it
// until the year 5138; a token (expiry ms × 1000 + k) is above it since
// 1973.
const legacyScore = 1e14

// startScanMax is the most entries (data, leases, attempts) a start
// checks one by one on a namespace without the schema key; above it, the
// start refuses and names delayd migrate.
const startScanMax = 10_000

// ErrMigrate marks a namespace that holds, or may hold, data of a retired
// stored format: a daemon does not start on it before delayd migrate ran.
var ErrMigrate = errors.New("run `delayd migrate`")

// Legacy counts a namespace's data of the retired formats 1, 2 and 4.
type Legacy struct {
	// Bare values: envelopes without the value header (format 1).
	Bare int64 `json:"bare_values"`
	// Leases: lease scores that are the expiry in ms, whole (format 1)
	// or plus a fraction (format 2), not a token.
	Leases int64 `json:"lease_scores"`
	// Attempts: attempts values "attempt:due:token" (format 1).
	Attempts int64 `json:"attempts_values"`
	// Buckets: pending envelopes in the due buckets (format 4, the
	// builds' opt-in redis.due_buckets), not in the due set.
	Buckets int64 `json:"due_buckets"`
}

// Total is the number of entries counted.
func (l Legacy) Total() int64 { return l.Bare + l.Leases + l.Attempts + l.Buckets }

func (l Legacy) String() string {
	return fmt.Sprintf("%d values without the header (format 1), %d lease scores of formats 1 and 2, "+
		"%d attempts values of format 1, %d envelopes in the due buckets of format 4", l.Bare, l.Leases, l.Attempts, l.Buckets)
}

// oldAttempts matches an attempts value of format 1, "attempt:due:token":
// the attempt counted the current claim too while it had a token.
var oldAttempts = regexp.MustCompile(`^(\d+):(\d*):?(.*)$`)

// scanHash calls f with every field and value of a hash, a page at a time.
func (s *Store) scanHash(ctx context.Context, key string, f func(kv []string) error) error {
	var cursor uint64
	for {
		kv, next, err := s.rdb.HScan(ctx, key, cursor, "", 500).Result()
		if err != nil {
			return err
		}
		if err := f(kv); err != nil {
			return err
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// Legacy counts the data of the retired formats in every shard: every
// value and attempts entry, and the lease scores below legacyScore.
func (s *Store) Legacy(ctx context.Context) (Legacy, error) {
	var l Legacy
	for sh := range s.shards {
		k := s.keys[sh]
		err := s.scanHash(ctx, k.data, func(kv []string) error {
			for i := 1; i < len(kv); i += 2 {
				if readableFormat(kv[i]) == FormatBare {
					l.Bare++
				}
			}
			return nil
		})
		if err == nil {
			err = s.scanHash(ctx, k.attempts, func(kv []string) error {
				for i := 1; i < len(kv); i += 2 {
					if strings.Contains(kv[i], ":") {
						l.Attempts++
					}
				}
				return nil
			})
		}
		if err != nil {
			return Legacy{}, fmt.Errorf("store: retired formats in shard %d: %w", sh, err)
		}
		n, err := s.rdb.ZCount(ctx, k.inflight, "-inf", "("+strconv.FormatInt(legacyScore, 10)).Result()
		if err != nil {
			return Legacy{}, fmt.Errorf("store: retired lease scores in shard %d: %w", sh, err)
		}
		l.Leases += n
	}
	var err error
	l.Buckets, err = s.bucketed(ctx)
	return l, err
}

// bucketed counts the entries of every shard's due buckets (keys.go,
// pending): its index's buckets, one ZCARD each, one round trip a step.
func (s *Store) bucketed(ctx context.Context) (int64, error) {
	pipe := s.rdb.Pipeline()
	index := make([]*redis.StringSliceCmd, s.shards)
	for sh, k := range s.keys {
		index[sh] = pipe.ZRange(ctx, k.pending, 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: read the due buckets: %w", err)
	}
	var cards []*redis.IntCmd
	for sh, k := range s.keys {
		for _, b := range index[sh].Val() {
			cards = append(cards, pipe.ZCard(ctx, k.pending+":"+b))
		}
	}
	if len(cards) == 0 {
		return 0, nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: count the due buckets: %w", err)
	}
	var n int64
	for _, c := range cards {
		n += c.Val()
	}
	return n, nil
}

// Schema reads the namespace's schema key: the oldest format its data
// may hold, 0 when the key is not there.
func (s *Store) Schema(ctx context.Context) (int, error) {
	v, err := s.rdb.Get(ctx, schemaKey(s.ns)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: read the schema key: %w", err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("store: the schema key %s holds %q, not a format", schemaKey(s.ns), v)
	}
	return n, nil
}

// CheckSchema is a daemon's check at start that the namespace holds no
// data of a retired format (above); it opens the store's gate
// (WithSchemaGate). An error wrapping ErrMigrate is final: the namespace
// needs delayd migrate. Any other is Redis' and worth a retry.
func (s *Store) CheckSchema(ctx context.Context) error {
	f, err := s.Schema(ctx)
	if err != nil {
		return err
	}
	if f == 0 {
		if err := s.firstSchema(ctx); err != nil {
			return err
		}
	} else if err := s.noBuckets(ctx); err != nil {
		// The builds before 0.2.0 that wrote the key could write the due
		// buckets too (format 4 sorts after 3): one read a shard, and
		// waited for (not final) while such a daemon lives.
		return err
	}
	s.schemaOK.Store(true)
	return nil
}

// noBuckets refuses a namespace whose due buckets (format 4, retired)
// hold envelopes, naming delayd migrate.
func (s *Store) noBuckets(ctx context.Context) error {
	if err := s.olderBuildLive(ctx, true); err != nil {
		return fmt.Errorf("%w; waiting for it", err)
	}
	n, err := s.bucketed(ctx)
	if err != nil || n == 0 {
		return err
	}
	return fmt.Errorf("store: namespace %q holds %d envelopes in the due buckets of the retired stored format 4 "+
		"(redis.due_buckets of a build before 0.2.0), which this version does not read: %w once; it is safe beside "+
		"running daemons that have redis.due_buckets off (docs/operations.md, Upgrading)", s.ns, n, ErrMigrate)
}

// firstSchema checks a namespace without the schema key, and writes the
// key when it holds nothing older than format 3.
func (s *Store) firstSchema(ctx context.Context) error {
	pipe := s.rdb.Pipeline()
	counts := make([]*redis.IntCmd, 0, 3*s.shards)
	for _, k := range s.keys {
		counts = append(counts, pipe.HLen(ctx, k.data), pipe.ZCard(ctx, k.inflight), pipe.HLen(ctx, k.attempts))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store: count the entries: %w", err)
	}
	var n int64
	for _, c := range counts {
		n += c.Val()
	}
	if n > startScanMax {
		return fmt.Errorf("store: namespace %q holds %d entries and no record of their stored format (%s): "+
			"a build before this version wrote them, maybe in a retired format; %w once (beside daemons of builds "+
			"from stored format 3 on it is safe; daemons of builds before it must be stopped first): it checks every entry, "+
			"moves what a retired format holds, and records the format "+
			"(docs/operations.md, Upgrading)", s.ns, n, schemaKey(s.ns), ErrMigrate)
	}
	if n > 0 {
		l, err := s.Legacy(ctx)
		if err != nil {
			return err
		}
		if l.Total() > 0 {
			return fmt.Errorf("store: namespace %q holds data of a retired stored format: %s; stop the daemons of "+
				"older builds, then %w (docs/operations.md, Upgrading)", s.ns, l, ErrMigrate)
		}
	}
	// A build before format 3 that runs beside this one writes the
	// retired formats, maybe none yet: waited for (not final), so the key
	// is not written for it.
	if err := s.olderBuildLive(ctx, false); err != nil {
		return fmt.Errorf("%w; waiting for it to stop (there is no rolling upgrade from builds before 0.2.0)", err)
	}
	if err := s.rdb.Set(ctx, schemaKey(s.ns), FormatIntegerLeases, 0).Err(); err != nil {
		return fmt.Errorf("store: write the schema key: %w", err)
	}
	return nil
}

// errSchemaUnchecked refuses the shard scripts of a gated store
// (WithSchemaGate) before CheckSchema passed.
var errSchemaUnchecked = errors.New("the stored format of the namespace is not checked yet")

// WithSchemaGate refuses every shard script call (ErrNotWritten) until
// CheckSchema passed: a daemon's store, whose scanner and intake start
// beside the check.
func WithSchemaGate() Option {
	return func(s *Store) { s.gated = true }
}

// WithMember names the daemon the store runs in (its member id): its own
// member entry, which may come before its first format announcement, is
// not taken for an older build's.
func WithMember(id string) Option {
	return func(s *Store) { s.self = id }
}

// migrateTries bounds the optimistic transactions of one batch (WATCH):
// another writer on the shard makes one fail, and it is read again.
const migrateTries = 50

// ErrOlderBuildLive refuses delayd migrate while a daemon of a build that
// writes a retired format lives: before format 3, or with the due buckets
// (format 4) on.
var ErrOlderBuildLive = errors.New("a daemon of a build that writes a retired stored format is live (it announces no format, " +
	"one before 3, or 4, redis.due_buckets): stop it, or restart it with redis.due_buckets off, first " +
	"(one stopped by a kill counts until its heartbeat ends, within ownership.ttl)")

// Migrate moves the namespace's data of the retired formats to format 3,
// shard by shard, and then writes the schema key: values without the
// header are stamped with their due time (from their attempts value, else
// their due score, else now), attempts values "attempt:due:token" become
// the count "n" before the current lease (deleted at 0), a lease score
// that is an expiry in ms becomes a token of that expiry, and the entries
// of the due buckets move to the due set at their due times. Each
// entry is rewritten by an optimistic transaction that reads it again, so
// it is safe beside daemons of builds from format 3 on, and again after
// being cut off (it is idempotent per entry: a rewritten entry is no
// longer found). It refuses while a daemon of an older build lives. done,
// when not nil, is told of each shard finished. It returns what it moved.
func (s *Store) Migrate(ctx context.Context, done func(shard int, moved Legacy)) (Legacy, error) {
	if err := s.olderBuildLive(ctx, false); err != nil {
		return Legacy{}, err
	}
	var all Legacy
	for sh := range s.shards {
		var l Legacy
		var err error
		// Values first: a bare value's due time may be in its attempts value.
		if l.Bare, err = s.migrateValues(ctx, sh); err == nil {
			if l.Attempts, err = s.migrateAttempts(ctx, sh); err == nil {
				if l.Leases, err = s.migrateLeases(ctx, sh); err == nil {
					l.Buckets, err = s.migrateBuckets(ctx, sh)
				}
			}
		}
		all.Bare, all.Attempts, all.Leases, all.Buckets = all.Bare+l.Bare, all.Attempts+l.Attempts, all.Leases+l.Leases, all.Buckets+l.Buckets
		if err != nil {
			return all, fmt.Errorf("store: migrate shard %d: %w", sh, err)
		}
		if done != nil {
			done(sh, l)
		}
	}
	if err := s.rdb.Set(ctx, schemaKey(s.ns), FormatIntegerLeases, 0).Err(); err != nil {
		return all, fmt.Errorf("store: write the schema key: %w", err)
	}
	return all, nil
}

// RetiredWriterLive returns ErrOlderBuildLive while a live daemon
// announces a retired format (before 3, or the due buckets, 4): it may
// write such data at any moment, which a repair by Check would take for
// damage (a bucket's id for unindexed data, made due now).
func (s *Store) RetiredWriterLive(ctx context.Context) error { return s.olderBuildLive(ctx, true) }

// olderBuildLive returns ErrOlderBuildLive when a live member announces no
// format, or a live announcement is of a format before 3, or of the due
// buckets (4): a daemon with redis.due_buckets on, which writes them once
// every live daemon does. With announcedOnly, a live member that
// announces nothing (a peer of this version between its first heartbeat
// and its announcement, or one killed whose announcement ended first) is
// not counted: the check of every start, where only the due buckets'
// writers matter, must not wait for such a peer.
func (s *Store) olderBuildLive(ctx context.Context, announcedOnly bool) error {
	// Redis' time, as the expiries are: a host whose clock runs ahead
	// would take live daemons for gone.
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("store: read Redis' time: %w", err)
	}
	now := strconv.FormatInt(t.UnixMilli(), 10)
	members, err := s.rdb.ZRangeByScore(ctx, membersKey(s.ns), &redis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		return fmt.Errorf("store: read the members: %w", err)
	}
	formats, err := s.rdb.ZRangeByScore(ctx, formatsKey(s.ns), &redis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		return fmt.Errorf("store: read the formats: %w", err)
	}
	announced := map[string]bool{}
	for _, v := range formats {
		f, id, _ := strings.Cut(v, ":")
		if id == s.self {
			continue
		}
		if n, err := strconv.Atoi(f); err == nil && (n < FormatIntegerLeases || n == FormatDueBuckets) {
			return fmt.Errorf("store: %w (%s announces format %d)", ErrOlderBuildLive, id, n)
		}
		announced[id] = true
	}
	for _, m := range members {
		if !announcedOnly && !announced[m] && m != s.self {
			return fmt.Errorf("store: %w (%s)", ErrOlderBuildLive, m)
		}
	}
	return nil
}

// rewrite runs one optimistic transaction on keys (one shard's): plan
// reads, and returns the writes to queue, or nil for none. It is tried
// again while another writer changes a watched key in between.
func (s *Store) rewrite(ctx context.Context, plan func(tx *redis.Tx) (func(redis.Pipeliner), error), keys ...string) error {
	for range migrateTries {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			write, err := plan(tx)
			if err != nil || write == nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { write(p); return nil })
			return err
		}, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("the shard changed under %d tries in a row: run delayd migrate again", migrateTries)
}

// migrateValues stamps the shard's values without the header.
func (s *Store) migrateValues(ctx context.Context, sh int) (int64, error) {
	k := s.keys[sh]
	var moved int64
	err := s.scanHash(ctx, k.data, func(kv []string) error {
		var ids []string
		for i := 1; i < len(kv); i += 2 {
			if readableFormat(kv[i]) == FormatBare {
				ids = append(ids, kv[i-1])
			}
		}
		if len(ids) == 0 {
			return nil
		}
		return s.rewrite(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
			vals, err := tx.HMGet(ctx, k.data, ids...).Result()
			if err != nil {
				return nil, err
			}
			atts, err := tx.HMGet(ctx, k.attempts, ids...).Result()
			if err != nil {
				return nil, err
			}
			nowMs := time.Now().UnixMilli()
			var fresh []any
			for i, id := range ids {
				v, _ := vals[i].(string)
				if vals[i] == nil || readableFormat(v) != FormatBare {
					continue // gone, or stamped meanwhile
				}
				due := int64(-1)
				if a, _ := atts[i].(string); a != "" {
					if m := oldAttempts.FindStringSubmatch(a); m != nil && m[2] != "" {
						due, _ = strconv.ParseInt(m[2], 10, 64)
					}
				}
				if due < 0 {
					if sc, err := tx.ZScore(ctx, k.due, id).Result(); err == nil {
						due = int64(sc)
					} else if !errors.Is(err, redis.Nil) {
						return nil, err
					}
				}
				if due < 0 {
					due = nowMs
				}
				fresh = append(fresh, id, stampValue(valueMark, due, 0, []byte(v)))
			}
			if len(fresh) == 0 {
				return nil, nil
			}
			moved += int64(len(fresh) / 2)
			return func(p redis.Pipeliner) { p.HSet(ctx, k.data, fresh...) }, nil
		}, k.data, k.attempts, k.due)
	})
	return moved, err
}

// migrateAttempts rewrites the shard's attempts values of format 1.
func (s *Store) migrateAttempts(ctx context.Context, sh int) (int64, error) {
	k := s.keys[sh]
	var moved int64
	err := s.scanHash(ctx, k.attempts, func(kv []string) error {
		var ids []string
		for i := 1; i < len(kv); i += 2 {
			if strings.Contains(kv[i], ":") {
				ids = append(ids, kv[i-1])
			}
		}
		if len(ids) == 0 {
			return nil
		}
		return s.rewrite(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
			atts, err := tx.HMGet(ctx, k.attempts, ids...).Result()
			if err != nil {
				return nil, err
			}
			var counts []any
			var zero []string
			for i, id := range ids {
				a, _ := atts[i].(string)
				m := oldAttempts.FindStringSubmatch(a)
				if m == nil {
					continue // gone, or rewritten meanwhile
				}
				n, _ := strconv.Atoi(m[1])
				if m[3] != "" {
					n-- // it counted the claim under way
				}
				if n > 0 {
					counts = append(counts, id, strconv.Itoa(n))
				} else {
					zero = append(zero, id)
				}
			}
			if len(counts)+len(zero) == 0 {
				return nil, nil
			}
			moved += int64(len(counts)/2 + len(zero))
			return func(p redis.Pipeliner) {
				if len(counts) > 0 {
					p.HSet(ctx, k.attempts, counts...)
				}
				if len(zero) > 0 {
					p.HDel(ctx, k.attempts, zero...)
				}
			}, nil
		}, k.attempts)
	})
	return moved, err
}

// migrateLeases rewrites the shard's lease scores of formats 1 and 2 as
// tokens of the same expiry: a fraction's own token (format 2 wrote
// expiry + k/1000), a whole ms's expiry × 1000 + 1. Nothing can settle
// them any more (their daemons are gone, and a settle names the old
// score): the token only needs to end the lease when the old score did.
func (s *Store) migrateLeases(ctx context.Context, sh int) (int64, error) {
	k := s.keys[sh]
	below := "(" + strconv.FormatInt(legacyScore, 10)
	var moved int64
	for {
		var n int
		err := s.rewrite(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
			zs, err := tx.ZRangeByScoreWithScores(ctx, k.inflight, &redis.ZRangeBy{Min: "-inf", Max: below, Count: 500}).Result()
			if err != nil || len(zs) == 0 {
				return nil, err
			}
			tokens := make([]redis.Z, len(zs))
			for i, z := range zs {
				// A score before 1973 (none a build wrote) ended long ago:
				// just above legacyScore, so it is not found again.
				t := max(int64(math.Round(z.Score*1000)), legacyScore)
				if t%1000 == 0 {
					t++
				}
				tokens[i] = redis.Z{Score: float64(t), Member: z.Member}
			}
			n = len(zs)
			return func(p redis.Pipeliner) { p.ZAddXX(ctx, k.inflight, tokens...) }, nil
		}, k.inflight)
		if err != nil || n == 0 {
			return moved, err
		}
		moved += int64(n)
	}
}

// migrateBuckets moves the shard's due buckets (format 4) into the due
// set, a bucket at a time: its entries at their due times (an id in the
// due set already, which a script cut part-way could leave, keeps that
// entry), then the bucket and its index entry go; the index's count last.
func (s *Store) migrateBuckets(ctx context.Context, sh int) (int64, error) {
	k := s.keys[sh]
	var moved int64
	for {
		bs, err := s.rdb.ZRange(ctx, k.pending, 0, 99).Result()
		if err != nil {
			return moved, err
		}
		if len(bs) == 0 {
			return moved, s.rdb.Del(ctx, k.pending+"#").Err()
		}
		for _, b := range bs {
			key, n := k.pending+":"+b, 0
			err := s.rewrite(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
				zs, err := tx.ZRangeWithScores(ctx, key, 0, -1).Result()
				if err != nil {
					return nil, err
				}
				n = len(zs)
				return func(p redis.Pipeliner) {
					if len(zs) > 0 {
						p.ZAddNX(ctx, k.due, zs...)
					}
					p.Del(ctx, key)
					p.ZRem(ctx, k.pending, b)
				}, nil
			}, key, k.pending)
			if err != nil {
				return moved, err
			}
			moved += int64(n)
		}
	}
}
