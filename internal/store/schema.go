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

// Legacy counts a namespace's data of the retired formats 1 and 2.
type Legacy struct {
	// Bare values: envelopes without the value header (format 1).
	Bare int64 `json:"bare_values"`
	// Leases: lease scores that are the expiry in ms, whole (format 1)
	// or plus a fraction (format 2), not a token.
	Leases int64 `json:"lease_scores"`
	// Attempts: attempts values "attempt:due:token" (format 1).
	Attempts int64 `json:"attempts_values"`
}

// Total is the number of entries counted.
func (l Legacy) Total() int64 { return l.Bare + l.Leases + l.Attempts }

func (l Legacy) String() string {
	return fmt.Sprintf("%d values without the header (format 1), %d lease scores of formats 1 and 2, "+
		"%d attempts values of format 1", l.Bare, l.Leases, l.Attempts)
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
	return l, nil
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
	}
	s.schemaOK.Store(true)
	return nil
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
	if err := s.olderBuildLive(ctx); err != nil {
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

// ErrOlderBuildLive refuses delayd migrate while a daemon of a build
// before format 3 lives: it would go on writing the retired formats.
var ErrOlderBuildLive = errors.New("a daemon of a build before stored format 3 is live (it announces no format, " +
	"or an older one): stop it first (one stopped by a kill counts until its heartbeat ends, within ownership.ttl)")

// Migrate moves the namespace's data of the retired formats to format 3,
// shard by shard, and then writes the schema key: values without the
// header are stamped with their due time (from their attempts value, else
// their due score, else now), attempts values "attempt:due:token" become
// the count "n" before the current lease (deleted at 0), and a lease
// score that is an expiry in ms becomes a token of that expiry. Each
// entry is rewritten by an optimistic transaction that reads it again, so
// it is safe beside daemons of builds from format 3 on, and again after
// being cut off (it is idempotent per entry: a rewritten entry is no
// longer found). It refuses while a daemon of an older build lives. done,
// when not nil, is told of each shard finished. It returns what it moved.
func (s *Store) Migrate(ctx context.Context, done func(shard int, moved Legacy)) (Legacy, error) {
	if err := s.olderBuildLive(ctx); err != nil {
		return Legacy{}, err
	}
	var all Legacy
	for sh := range s.shards {
		var l Legacy
		var err error
		// Values first: a bare value's due time may be in its attempts value.
		if l.Bare, err = s.migrateValues(ctx, sh); err == nil {
			if l.Attempts, err = s.migrateAttempts(ctx, sh); err == nil {
				l.Leases, err = s.migrateLeases(ctx, sh)
			}
		}
		all.Bare, all.Attempts, all.Leases = all.Bare+l.Bare, all.Attempts+l.Attempts, all.Leases+l.Leases
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

// olderBuildLive returns ErrOlderBuildLive when a live member announces no
// format, or a live announcement is of a format before 3.
func (s *Store) olderBuildLive(ctx context.Context) error {
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
		if n, err := strconv.Atoi(f); err == nil && n < FormatIntegerLeases {
			return fmt.Errorf("store: %w (%s announces format %d)", ErrOlderBuildLive, id, n)
		}
		announced[id] = true
	}
	for _, m := range members {
		if !announced[m] && m != s.self {
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
