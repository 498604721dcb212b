package bridge

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
func pipeline[T any](queue <-chan T, size int, linger time.Duration, flush func([]T)) (drained func()) {
	batches := make(chan []T)
	var wg sync.WaitGroup
	for range flushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				flush(b)
			}
		}()
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		collect(queue, batches, size, linger)
	}()
	return func() {
		<-collected
		wg.Wait()
	}
}

// collect groups queued items into batches. A batch is handed to the
// first free flusher; while every flusher is busy it keeps growing, up to
// size items. So batches are as large as the load makes them, without a
// fixed wait: under light load an item goes to Redis at once. Linger, if
// positive, waits that long for company when a flusher is free.
func collect[T any](in <-chan T, out chan<- []T, size int, linger time.Duration) {
	defer close(out)
	var wait <-chan time.Time
	for {
		first, ok := <-in
		if !ok {
			return
		}
		batch := make([]T, 1, size)
		batch[0] = first
		if linger > 0 {
			wait = time.After(linger)
		}
		queue := in
		for {
			var send chan<- []T
			if wait == nil || len(batch) == size {
				send = out
			}
			if len(batch) == size {
				queue = nil // full: only sending is left
			}
			select {
			case send <- batch:
			case p, ok := <-queue:
				if !ok {
					out <- batch
					return
				}
				batch = append(batch, p)
				continue
			case <-wait:
				wait = nil
				continue
			}
			break
		}
		wait = nil
	}
}
