package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// List pages in due order across shards (ties by id), the cursor carries
// on where the last page stopped even inside a run of equal due times,
// and the last page says it is the last.
func TestListDueOrderAcrossShards(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	type want struct {
		id  string
		due int64
	}
	var all []want
	var items []Item
	for i := range 40 {
		// Ten distinct due times, four envelopes each, spread over shards
		// by their ids; ids sort differently from the order of i.
		due := base.Add(time.Duration(9-i%10) * time.Second)
		id := fmt.Sprintf("e-%c%02d", 'z'-i%7, i)
		items = append(items, Item{ID: id, Absolute: true, AtMicros: due.UnixMicro(), Data: enc("x")})
		all = append(all, want{id, due.UnixMilli()})
	}
	// A run of 25 equal due times, so the cursor must find its place
	// inside a run in several shards.
	run := base.Add(-time.Second)
	for i := range 25 {
		id := fmt.Sprintf("run-%02d", 24-i)
		items = append(items, Item{ID: id, Absolute: true, AtMicros: run.UnixMicro(), Data: enc("x")})
		all = append(all, want{id, run.UnixMilli()})
	}
	schedule(t, s, items...)
	slices.SortFunc(all, func(a, b want) int {
		if a.due != b.due {
			return int(a.due - b.due)
		}
		return strings.Compare(a.id, b.id)
	})
	shardsSeen := map[int]bool{}
	for _, limit := range []int{1, 3, 7, 65, 100} {
		var got []want
		cur := Cursor{}
		for pages := 0; ; pages++ {
			entries, next, done, err := s.List(ctx, ListOptions{Limit: limit, Cursor: cur})
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(entries))
			}
			for _, e := range entries {
				got = append(got, want{e.ID, e.DueMs})
				shardsSeen[e.Shard] = true
				if e.Shard != s.Shard(e.ID) || len(e.Data) == 0 {
					t.Fatalf("entry %s: shard %d, data %q", e.ID, e.Shard, e.Data)
				}
			}
			if done {
				break
			}
			if len(entries) == 0 {
				t.Fatalf("limit %d: empty page that is not the last", limit)
			}
			cur = next
			// The cursor survives its text form.
			if cur, err = ParseCursor(next.String()); err != nil {
				t.Fatal(err)
			}
			if pages > len(all) {
				t.Fatalf("limit %d: paging does not end", limit)
			}
		}
		if !slices.Equal(got, all) {
			t.Fatalf("limit %d: order\n got %v\nwant %v", limit, got, all)
		}
	}
	if len(shardsSeen) < 2 {
		t.Fatal("test data fell in one shard")
	}
	// Exactly a page left: the page that holds it is the last.
	_, _, done, err := s.List(ctx, ListOptions{Limit: len(all)})
	if err != nil || !done {
		t.Errorf("a page holding every entry is not the last: done=%v err=%v", done, err)
	}
	// due_before bounds the merge too.
	entries, _, done, err := s.List(ctx, ListOptions{Limit: 100, DueBefore: base.UnixMilli()})
	if err != nil || !done || len(entries) != 25 {
		t.Errorf("due_before: %d entries, done=%v, err=%v; want the 25 of the run", len(entries), done, err)
	}
	if _, err := ParseCursor("3:40"); err == nil {
		t.Error("an old shard:offset cursor parsed")
	}
}
