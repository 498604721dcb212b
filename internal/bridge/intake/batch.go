package intake

import (
	"sync"
	"time"
)

// flushers is how many pipelines may be in flight at once, so that one
// batch's Redis round trip overlaps the collection of the next.
const flushers = 4

// pipeline batches what arrives on queue and runs flushers goroutines
// that store the batches, until queue is closed. The returned function
// waits until every batch is stored. Both intakes use it.
//
// A free flusher gathers the next batch itself: it takes the first item,
// everything queued behind it up to size, and with linger whatever else
// arrives within linger, then flushes. One flusher gathers at a time, so
// while every other one is busy the queue fills and the next batch grows;
// while one is free an item goes to Redis at once. A request thus makes
// one goroutine hand-off on its way to Redis (handler → flusher), not two
// through a collector: the latency budget (BenchmarkScheduleCall) showed
// each hand-off's wake-up costing as much as the work.
func pipeline[T any](queue <-chan T, size int, linger time.Duration, flush func([]T)) (drained func()) {
	var gathering sync.Mutex
	var wg sync.WaitGroup
	for range flushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each flusher reuses its own batch: one of size items per
			// gather was most of what a schedule call allocated (the
			// budget's memory profile), for batches of a dozen.
			buf := make([]T, 0, size)
			for {
				gathering.Lock()
				batch, ok := gather(queue, buf, size, linger)
				gathering.Unlock()
				if len(batch) > 0 {
					flush(batch)
				}
				// Let go of what the batch held (payloads up to
				// max_payload each) until the next one overwrites it.
				clear(batch)
				if !ok {
					return
				}
			}
		}()
	}
	return wg.Wait
}

// gather waits for an item, then adds what is queued behind it, up to size
// items, into buf (emptied first); with a positive linger it waits that
// long for more while the batch is not full. It returns false once queue
// is closed and empty. flush must not keep a batch after it returns.
func gather[T any](queue <-chan T, buf []T, size int, linger time.Duration) ([]T, bool) {
	first, ok := <-queue
	if !ok {
		return nil, false
	}
	batch := append(buf[:0], first)
	var wait <-chan time.Time
	if linger > 0 {
		t := time.NewTimer(linger)
		defer t.Stop()
		wait = t.C
	}
	for len(batch) < size {
		select {
		case p, ok := <-queue:
			if !ok {
				return batch, false
			}
			batch = append(batch, p)
			continue
		default:
		}
		if wait == nil {
			break
		}
		select {
		case p, ok := <-queue:
			if !ok {
				return batch, false
			}
			batch = append(batch, p)
		case <-wait:
			wait = nil
		}
	}
	return batch, true
}
