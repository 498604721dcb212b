package store

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/envelope"
)

// floorDir holds the floor's scripts (../shared/floor beside the checkout:
// the least Redis work an at-least-once delay set with unique claim tokens
// needs). They stay there, not copied in: BenchmarkVsFloor skips where the
// folder is absent.
var floorDir = filepath.Join("..", "..", "..", "shared", "floor")

// BenchmarkVsFloor measures the store against the floor on one Redis,
// alternated within every op (the floor's round, then the store's), as
// Redis main-thread CPU per envelope (INFO cpu; the machine's load moves
// it less than wall time) and the ratio of the two. Per op and per shard
// size k (envelopes of one shard per call), over 16 shards with 10,000
// envelopes pending a day ahead and values of 128-byte payloads:
//   - schedule: 16 calls of k envelopes, one a shard, pipelined; the store
//     with one Schedule of the same 16k envelopes;
//   - claim+ack: 16k envelopes made due beforehand (not measured), then
//     one pipeline of 16 claims and one of 16 acks with each claim's
//     token; the store with Claim of all 16 shards and one Ack.
//
// The store's ids carry a publisher's request fingerprint, as the
// default resend tombstones are written (WithResendMemory's default).
//
//	go test -run '^$' -bench VsFloor -benchtime 200x ./internal/store
func BenchmarkVsFloor(b *testing.B) {
	if _, err := os.Stat(filepath.Join(floorDir, "claim.lua")); err != nil {
		b.Skipf("the floor's scripts are not at %s: %v", floorDir, err)
	}
	read := func(name string) *redis.Script {
		src, err := os.ReadFile(filepath.Join(floorDir, name))
		if err != nil {
			b.Fatal(err)
		}
		return redis.NewScript(string(src))
	}
	fSchedule, fClaim, fAck := read("schedule.lua"), read("claim.lua"), read("ack.lua")
	for _, k := range []int{4, 16, 64} {
		for _, phase := range []string{"schedule", "claim+ack"} {
			b.Run(phase+"/per-shard="+strconv.Itoa(k), func(b *testing.B) {
				s, r := benchStore(b)
				fill(b, s, 10_000, "p")
				f := &floor{rc: r.Client(), shards: s.Shards(), schedule: fSchedule, claim: fClaim, ack: fAck}
				for _, sc := range []*redis.Script{fSchedule, fClaim, fAck} {
					if err := sc.Load(context.Background(), f.rc).Err(); err != nil {
						b.Fatal(err)
					}
				}
				f.fill(b, 10_000)
				ids := idsByShard(s, k, b.N)
				var fl, st float64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if phase == "schedule" {
						fl += f.cpu(b, func() { f.scheduleRound(b, ids[i], time.Hour) })
						items := vsFloorItems(ids[i], 3600e6, false)
						st += f.cpu(b, func() { schedule(b, s, items...) })
						continue
					}
					b.StopTimer()
					f.scheduleRound(b, ids[i], -time.Second)
					schedule(b, s, vsFloorItems(ids[i], 0, true)...)
					b.StartTimer()
					fl += f.cpu(b, func() { f.claimAckRound(b, k) })
					st += f.cpu(b, func() { storeClaimAck(b, s, 16*k) })
				}
				n := float64(b.N * 16 * k)
				b.ReportMetric(fl/n, "floor-cpu-µs/envelope")
				b.ReportMetric(st/n, "store-cpu-µs/envelope")
				b.ReportMetric(st/fl, "store/floor")
			})
		}
	}
}

// floor runs the floor's scripts on its own keys ({f:<shard>}:due, data,
// lease) beside the store's.
type floor struct {
	rc                   *redis.Client
	shards               int
	schedule, claim, ack *redis.Script
	seq                  int
}

func floorKeys(shard int) []string {
	tag := "{f:" + strconv.Itoa(shard) + "}:"
	return []string{tag + "due", tag + "data", tag + "lease"}
}

// floorValue is a stored value of the size the store keeps for the same
// envelope (the floor's own format is the value alone).
var floorValue = string(envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)}))

func (f *floor) fill(b *testing.B, n int) {
	b.Helper()
	per := n / f.shards
	ids := make([][]string, f.shards)
	for sh := range ids {
		for j := 0; j < per; j++ {
			ids[sh] = append(ids[sh], "fp"+strconv.Itoa(sh)+"-"+strconv.Itoa(j))
		}
	}
	f.scheduleRound(b, ids, 24*time.Hour)
}

// scheduleRound schedules ids[shard] on each shard, one call a shard,
// pipelined, due in.
func (f *floor) scheduleRound(b *testing.B, ids [][]string, in time.Duration) {
	b.Helper()
	ctx := context.Background()
	due := strconv.FormatInt(time.Now().Add(in).UnixMilli(), 10)
	pipe := f.rc.Pipeline()
	for sh, list := range ids {
		argv := make([]any, 0, 4*len(list))
		for _, id := range list {
			argv = append(argv, "0", "f"+id, due, floorValue)
		}
		keys := floorKeys(sh)
		f.schedule.Run(ctx, pipe, keys[:2], argv...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
}

// claimAckRound claims up to k due envelopes on every shard in one
// pipeline, then acks each claim with its token in another.
func (f *floor) claimAckRound(b *testing.B, k int) {
	b.Helper()
	ctx := context.Background()
	pipe := f.rc.Pipeline()
	cmds := make([]*redis.Cmd, f.shards)
	for sh := range cmds {
		f.seq++
		cmds[sh] = f.claim.Run(ctx, pipe, floorKeys(sh), k, 60_000, f.seq%1000)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	pipe = f.rc.Pipeline()
	got := 0
	for sh, c := range cmds {
		out, _ := c.Slice()
		if len(out) <= 4 {
			continue
		}
		argv := []any{out[3]}
		for i := 4; i < len(out); i += 2 {
			argv = append(argv, out[i])
			got++
		}
		f.ack.Run(ctx, pipe, floorKeys(sh), argv...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	if got != f.shards*k {
		b.Fatalf("the floor claimed %d of %d", got, f.shards*k)
	}
}

// cpu runs fn and returns Redis' main-thread CPU µs it took.
func (f *floor) cpu(b *testing.B, fn func()) float64 {
	b.Helper()
	ctx := context.Background()
	before := readWork(f.rc.Info(ctx, "cpu").Val())
	fn()
	return readWork(f.rc.Info(ctx, "cpu").Val()).cpuUs - before.cpuUs
}

// idsByShard makes, for each of n rounds, k ids of each of the store's
// shards (the floor takes the same ids, prefixed, on its own keys).
func idsByShard(s *Store, k, n int) [][][]string {
	rounds := make([][][]string, n)
	next := 0
	for i := range rounds {
		rounds[i] = make([][]string, s.Shards())
		for full := 0; full < s.Shards(); {
			id := "v" + strconv.Itoa(next)
			next++
			sh := s.Shard(id)
			if len(rounds[i][sh]) < k {
				rounds[i][sh] = append(rounds[i][sh], id)
				if len(rounds[i][sh]) == k {
					full++
				}
			}
		}
	}
	return rounds
}

// vsFloorItems are the store's items for ids, with a publisher's request
// fingerprint each; due now when now, else in delayMicros.
func vsFloorItems(ids [][]string, delayMicros int64, now bool) []Item {
	var items []Item
	for _, list := range ids {
		for _, id := range list {
			var fp [8]byte
			binary.BigEndian.PutUint64(fp[:], uint64(len(items))*0x9e3779b97f4a7c15)
			e := envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128), Request: string(fp[:]), Stored: time.Now()}
			it := Item{ID: id, DelayMicros: delayMicros, Data: envelope.Encode(e), Request: e.Request}
			if now {
				it.Absolute, it.AtMicros, it.DelayMicros = true, 1, 0
			}
			items = append(items, it)
		}
	}
	return items
}

// storeClaimAck claims every shard once and acks what it claimed, with
// the tombstones of delivered requests.
func storeClaimAck(b *testing.B, s *Store, want int) {
	b.Helper()
	ctx := context.Background()
	shards := make([]int, s.Shards())
	for i := range shards {
		shards[i] = i
	}
	res, err := s.Claim(ctx, shards, ClaimOptions{Batch: 1024, Lease: time.Minute, Bytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	acks := map[int][]Settle{}
	got := 0
	for _, r := range res {
		for _, c := range r.Items {
			e, _ := envelope.Decode(c.Data)
			acks[r.Shard] = append(acks[r.Shard], Settle{ID: c.ID, Token: c.Token, Request: e.Request, SinceMs: c.DueMs})
			got++
		}
	}
	if got != want {
		b.Fatalf("the store claimed %d of %d", got, want)
	}
	if _, err := s.Ack(ctx, acks, time.Second); err != nil {
		b.Fatal(err)
	}
}
