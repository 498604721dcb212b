package store

import (
	"context"
	"testing"
)

// TestIntakeFloor: a floor only goes up for its stream; a stream of the
// same name made again (a later creation time) starts from none, and a
// daemon still bound to the old one cannot take the field back.
func TestIntakeFloor(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	const old, newer = int64(1700000000000000000), int64(1800000000000000000)
	floor := func(created int64) uint64 {
		t.Helper()
		f, err := s.IntakeFloor(ctx, "DELAYD_INTAKE", created)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := floor(old); f != 0 {
		t.Fatalf("floor %d before any was saved", f)
	}
	for _, f := range []uint64{5, 3, 9, 0} {
		if err := s.SaveIntakeFloor(ctx, "DELAYD_INTAKE", old, f); err != nil {
			t.Fatal(err)
		}
	}
	if f := floor(old); f != 9 {
		t.Fatalf("floor %d, want 9 (the highest saved)", f)
	}
	if f := floor(newer); f != 0 {
		t.Fatalf("a stream made again has floor %d, want none", f)
	}
	if err := s.SaveIntakeFloor(ctx, "DELAYD_INTAKE", newer, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveIntakeFloor(ctx, "DELAYD_INTAKE", old, 12); err != nil {
		t.Fatal(err)
	}
	if f, o := floor(newer), floor(old); f != 2 || o != 0 {
		t.Fatalf("newer stream floor %d (want 2), old %d (want 0: replaced)", f, o)
	}
	if f, _ := s.IntakeFloor(ctx, "OTHER", newer); f != 0 {
		t.Fatalf("another stream name has floor %d", f)
	}
	if !inNamespace(intakeKey("t"), "t") {
		t.Error("the floors key is outside the namespace: drop and the ACL pattern miss it")
	}
}
