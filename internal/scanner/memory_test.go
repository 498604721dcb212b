package scanner

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/delayd/delayd/internal/store"
)

func TestByteBudget(t *testing.T) {
	b := newByteBudget(100)
	if n, ok := b.next(); !ok || n != 100 {
		t.Fatalf("empty: %d %v", n, ok)
	}
	b.take(350)
	if n, ok := b.next(); !ok || n != 50 {
		t.Fatalf("350 held of 400: next claim %d %v, want the 50 left", n, ok)
	}
	b.take(80)
	if _, ok := b.next(); ok {
		t.Fatal("430 held: no claim may start")
	}
	b.release(430)
	select {
	case <-b.freed:
	default:
		t.Fatal("a release did not signal")
	}
	if n, ok := newByteBudget(0).next(); !ok || n != 0 {
		t.Fatalf("no bound: %d %v", n, ok)
	}
	items := []claimed{{Claimed: store.Claimed{Data: make([]byte, 7)}}, {Claimed: store.Claimed{Data: make([]byte, 5)}}}
	if n := bytesOf(items); n != 12+2*envelopeOverhead {
		t.Fatalf("bytesOf: %d, want the 12 stored bytes and two overheads", n)
	}
}

func TestAutoClaimBytesFollowsTheMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(math.MaxInt64)
	defer debug.SetMemoryLimit(old)
	if n := AutoClaimBytes(); n != DefaultClaimBytes {
		t.Fatalf("no limit: %d", n)
	}
	debug.SetMemoryLimit(96 << 20)
	if n := AutoClaimBytes(); n != 6<<20 {
		t.Fatalf("96 MiB limit: %d, want 6 MiB", n)
	}
	debug.SetMemoryLimit(512 << 20)
	if n := AutoClaimBytes(); n != DefaultClaimBytes {
		t.Fatalf("512 MiB limit: %d, want the 8 MiB default", n)
	}
}
