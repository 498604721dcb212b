package bench

import (
	"context"
	"errors"
	"os"
	"testing"
)

// A process name may hold spaces and parentheses: the times are counted
// from the last ")".
func TestParseProcStat(t *testing.T) {
	line := "4242 (nats (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 130 0 0 20 0 12 0 100 1000 10 1844 0 0"
	got, err := parseProcStat(line)
	if err != nil || got != 3.8 {
		t.Fatalf("parseProcStat = %v, %v; want 3.8 s (250 + 130 ticks)", got, err)
	}
	for _, bad := range []string{"", "4242 nats S 1", "4242 (n) S 1 2 3", "4242 (n) S 1 2 3 4 5 6 7 8 9 10 x 130"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) took it", bad)
		}
	}
	if s, err := procCPU(os.Getpid())(context.Background()); err != nil || s < 0 {
		t.Fatalf("this process' CPU: %v, %v", s, err)
	}
}

// A source that fails is left out from then on, so that a split never
// divides a span that one reading lacks; the others go on.
func TestMeterDropsAFailingSource(t *testing.T) {
	calls := 0
	flaky := func(context.Context) (float64, error) {
		calls++
		if calls == 2 {
			return 0, errors.New("gone")
		}
		return float64(calls), nil
	}
	steady := 0.0
	m := &meter{sources: []cpuSource{{ProcRedis, flaky}, {ProcDelayd, func(context.Context) (float64, error) {
		steady += 0.5
		return steady, nil
	}}}}
	a, b, c := m.take(context.Background()), m.take(context.Background()), m.take(context.Background())
	if _, ok := b[ProcRedis]; ok {
		t.Fatalf("a failed reading was kept: %v", b)
	}
	if _, ok := c[ProcRedis]; ok || calls != 2 {
		t.Fatalf("a failed source was read again: %v (%d calls)", c, calls)
	}
	split := perUnit(a, c, 4)
	if len(split) != 1 || split[ProcDelayd] != 250000 {
		t.Fatalf("split %v, want delayd's 1 s over 4 units only", split)
	}
	if perUnit(a, c, 0) != nil {
		t.Fatal("a split over no units")
	}
	var none *meter
	if got := none.take(context.Background()); len(got) != 0 {
		t.Fatalf("a nil meter read %v", got)
	}
}

// A JetStream-schedules run is charged with nats-server and the bench
// only: before, it reported the Redis CPU that the child's last writes
// and purges used meanwhile as its own (issue 29's review).
func TestMeterOnly(t *testing.T) {
	read := func(context.Context) (float64, error) { return 1, nil }
	m := &meter{sources: []cpuSource{{ProcRedis, read}, {ProcDelayd, read}, {ProcNATS, read}, {ProcBench, read}}}
	got := m.only(ProcNATS, ProcBench).take(context.Background())
	if _, ok := got[ProcRedis]; ok || len(got) != 2 {
		t.Fatalf("only nats and bench: read %v", got)
	}
	if len(m.take(context.Background())) != 4 {
		t.Fatal("only changed the meter it was taken from")
	}
	var none *meter
	if none.only(ProcNATS) != nil {
		t.Fatal("only of a nil meter")
	}
}
