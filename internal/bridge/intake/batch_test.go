package intake

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// flushGate is a flush that reports each batch and then waits until the
// test lets one flusher go.
type flushGate struct {
	started chan []int
	release chan struct{}
}

func newFlushGate() *flushGate {
	return &flushGate{started: make(chan []int, 64), release: make(chan struct{})}
}

func (g *flushGate) flush(b []int) {
	g.started <- slices.Clone(b) // the pipeline reuses b once flush returns
	<-g.release
}

func (g *flushGate) next(t *testing.T) []int {
	t.Helper()
	select {
	case b := <-g.started:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no batch flushed within 10s")
		return nil
	}
}

// waitTaken waits until a flusher has taken everything queued.
func waitTaken(t *testing.T, queue chan int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); len(queue) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d items still queued after 10s", len(queue))
		}
	}
}

// Batches are as large as the load makes them: while a flusher is free,
// each item goes to Redis alone and at once; while every flusher is busy,
// what arrives waits in one batch that grows up to the batch size.
func TestBatchesGrowOnlyWhileFlushersAreBusy(t *testing.T) {
	t.Parallel()
	g := newFlushGate()
	queue := make(chan int, 64)
	drained := pipeline(queue, 4, 0, g.flush)
	for i := range flushers {
		queue <- i
		if b := g.next(t); fmt.Sprint(b) != fmt.Sprint([]int{i}) {
			t.Fatalf("with a flusher free, item %d went out in %v", i, b)
		}
	}
	// Every flusher is busy: what arrives waits, and the flusher that
	// frees up first takes a batch of the first 4 (the batch size).
	for i := range 6 {
		queue <- 10 + i
	}
	g.release <- struct{}{}
	if b := g.next(t); fmt.Sprint(b) != fmt.Sprint([]int{10, 11, 12, 13}) {
		t.Errorf("the first batch after a flusher freed up: %v, want [10 11 12 13]", b)
	}
	g.release <- struct{}{}
	if b := g.next(t); fmt.Sprint(b) != fmt.Sprint([]int{14, 15}) {
		t.Errorf("the next batch: %v, want [14 15]", b)
	}
	close(g.release)
	close(queue)
	drained()
}

// Linger, when set, holds a batch for company while a flusher is free: a
// lone item goes out only after it, a full batch at once.
func TestBatchLinger(t *testing.T) {
	t.Parallel()
	g := newFlushGate()
	close(g.release) // flushers are never busy
	queue := make(chan int, 64)
	const linger = 30 * time.Millisecond
	drained := pipeline(queue, 2, linger, g.flush)
	sent := time.Now()
	queue <- 1
	if b := g.next(t); len(b) != 1 || time.Since(sent) < linger {
		t.Errorf("a lone item went out in %v after %s, want alone after the linger of %s", b, time.Since(sent), linger)
	}
	close(queue)
	drained()

	g = newFlushGate()
	close(g.release)
	queue = make(chan int, 64)
	drained = pipeline(queue, 2, time.Hour, g.flush)
	queue <- 1
	queue <- 2
	if b := g.next(t); fmt.Sprint(b) != fmt.Sprint([]int{1, 2}) {
		t.Errorf("two items under an hour's linger went out as %v, want [1 2] once the batch was full", b)
	}
	close(queue)
	drained()
}

// Closing the queue flushes what was taken in, however busy the flushers
// and however long the linger (an hour here), and drained returns only
// once every batch is flushed.
func TestBatchDrainOnClose(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		linger time.Duration
		busy   int // flushers busy when the queue closes
	}{{"flushers busy", 0, flushers}, {"lingering", time.Hour, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newFlushGate()
			queue := make(chan int, 64)
			drained := pipeline(queue, 16, tc.linger, g.flush)
			for i := range tc.busy {
				queue <- i
				g.next(t)
			}
			for i := range 3 {
				queue <- 100 + i
			}
			if tc.busy == 0 {
				waitTaken(t, queue) // the lingering flusher holds them
			}
			close(queue)
			done := make(chan struct{})
			go func() {
				drained()
				close(done)
			}()
			for range tc.busy {
				g.release <- struct{}{}
			}
			if b := g.next(t); fmt.Sprint(b) != fmt.Sprint([]int{100, 101, 102}) {
				t.Errorf("after close flushed %v, want [100 101 102]", b)
			}
			select {
			case <-done:
				t.Fatal("drained returned while a batch was still being flushed")
			default:
			}
			g.release <- struct{}{}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("drained did not return after the last flush")
			}
		})
	}
}

// A flusher reuses its batch, and clears it once flushed: what a batch
// held (payloads up to max_payload) is not kept alive until the next
// batch of that flusher overwrites it.
func TestPipelineLetsGoOfFlushedItems(t *testing.T) {
	t.Parallel()
	queue := make(chan *[]byte, 64)
	var mu sync.Mutex
	var seen [][]*[]byte
	drained := pipeline(queue, 8, 0, func(b []*[]byte) {
		mu.Lock()
		seen = append(seen, b) // kept against the rule, to look at later
		mu.Unlock()
	})
	for range 40 {
		p := make([]byte, 1<<10)
		queue <- &p
	}
	close(queue)
	drained()
	n := 0
	for _, b := range seen {
		for i, p := range b {
			n++
			if p != nil {
				t.Fatalf("item %d of a flushed batch still held after its flush", i)
			}
		}
	}
	if n != 40 {
		t.Fatalf("%d items flushed, want 40", n)
	}
}
