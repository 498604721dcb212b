package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Modes of a result.
const (
	ModeRequest   = "request/reply"
	ModeStream    = "stream intake"
	ModeSchedules = "JetStream schedules"
	// ModeBatch: ScheduleBatch requests of Result.Batch envelopes.
	ModeBatch = "batch requests"
	// ModeClientBatching: Schedule calls through client.Batching.
	ModeClientBatching = "client batching"
)

// streamOptions configure the runs that publish into JetStream.
type streamOptions struct {
	// Prefix is delayd's subject prefix: envelopes go to <Prefix>.intake.
	Prefix string
	// Window is the most PubAcks outstanding per connection.
	Window int
	// OneRequester, if positive, is how many calls in a row Schedules
	// also times from one requester alone (Result.OneRequester).
	OneRequester int
}

// publishShared publishes n messages over every client in parallel (client
// k takes every len(clients)-th message) and returns the time until the
// last PubAck, the failed publishes and the first failure ("" for none).
func publishShared(ctx context.Context, clients []*conn, n, window int, msg func(i int) outgoing, counter *atomic.Int64) (time.Duration, int, string, error) {
	var wg sync.WaitGroup
	var failed atomic.Int64
	errs := make([]error, len(clients))
	firsts := make([]error, len(clients))
	start := time.Now()
	for k, c := range clients {
		share := (n - k + len(clients) - 1) / len(clients)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, f, first, err := c.publishAsync(ctx, share, window, func(i int) outgoing { return msg(i*len(clients) + k) }, counter)
			failed.Add(int64(f))
			errs[k], firsts[k] = err, first
		}()
	}
	wg.Wait()
	took := time.Since(start)
	first := ""
	for _, err := range firsts {
		if err != nil {
			first = err.Error()
			break
		}
	}
	for _, err := range errs {
		if err != nil {
			return took, int(failed.Load()), first, err
		}
	}
	return took, int(failed.Load()), first, nil
}

func payloadOf(size int) []byte {
	p := make([]byte, size)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// dueAt is envelope i's due time: start+Lead, then spread evenly over
// Window.
func (w Workload) dueAt(start time.Time, i int) time.Time {
	return start.Add(w.Lead + time.Duration(int64(w.Window)*int64(i)/int64(w.Count)))
}

// streamBaseline publishes the same messages as RunStream into a stream
// nobody consumes and returns PubAcks per second: what JetStream alone
// takes on this machine.
func streamBaseline(ctx context.Context, clients []*conn, w Workload, o streamOptions, m *meter) (float64, map[string]float64, error) {
	const name, subject = "DELAYD_BENCH_BASELINE", "delayd-bench-baseline"
	drop, err := clients[0].benchStream(ctx, name, []string{subject + ".>"}, false)
	if err != nil {
		return 0, nil, err
	}
	defer drop()
	payload := payloadOf(w.PayloadSize)
	before := m.take(ctx)
	start := time.Now()
	took, failed, _, err := publishShared(ctx, clients, w.Count, o.Window, func(i int) outgoing {
		return outgoing{Subject: subject + ".intake", Header: intakeHeaders(w.Target, w.dueAt(start, i), "base-"+strconv.Itoa(i)), Data: payload}
	}, nil)
	if err != nil {
		return 0, nil, err
	}
	return float64(w.Count-failed) / took.Seconds(), perUnit(before, m.take(ctx), w.Count-failed), nil
}

// runStream publishes the workload into delayd's intake stream, times it
// until every envelope is pending in Redis (polling the admin stats
// endpoint), then watches the deliveries like Run.
func runStream(ctx context.Context, clients []*conn, w Workload, o streamOptions, progress io.Writer, m *meter) (Result, error) {
	prefix := "s" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	rec := newRecorder(w.Count)
	stop, err := clients[0].watch(w.Target, watchInto(rec, prefix))
	if err != nil {
		return Result{}, err
	}
	defer stop()
	before, err := clients[0].pendingTotal(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("bench: admin stats: %w", err)
	}
	payload := payloadOf(w.PayloadSize)
	atStart := m.take(ctx)
	start := time.Now()
	var acked atomic.Int64
	done := startReport(progress, w.Count, &acked, rec)
	pubTook, failed, first, err := publishShared(ctx, clients, w.Count, o.Window, func(i int) outgoing {
		return outgoing{Subject: o.Prefix + ".intake", Header: intakeHeaders(w.Target, w.dueAt(start, i), prefix+strconv.Itoa(i)), Data: payload}
	}, &acked)
	if err != nil {
		done()
		return Result{}, err
	}
	// Pending now: what is in Redis, plus what was already delivered.
	want := int64(w.Count - failed)
	var pendTook time.Duration
	for deadline := start.Add(w.Lead + w.Window + w.Grace); ; {
		n, err := clients[0].pendingTotal(ctx)
		if err == nil && n-before+int64(rec.unique()) >= want {
			pendTook = time.Since(start)
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			pendTook = time.Since(start)
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	stored := m.take(ctx)
	r, delivered := waitDeliveries(ctx, rec, w, start, int(want), done, m)
	r.setCPU(atStart, stored, delivered, int(want))
	r.Mode = ModeStream
	r.IntakeSeconds = pendTook.Seconds()
	r.IntakeRate = float64(want) / pendTook.Seconds()
	r.PubAckRate = float64(want) / pubTook.Seconds()
	r.Rejected, r.FirstRejection = failed, first
	return r, nil
}

// schedules runs the workload as NATS JetStream message schedules (ADR-51)
// on the server clients are connected to: one schedule per subject
// (bench.sched.in.<i>), each firing once into bench.sched.out.<i> of the
// same stream, read by an ordered consumer. Intake is the PubAck rate: a
// schedule is stored when it is acknowledged.
func schedules(ctx context.Context, clients []*conn, w Workload, o streamOptions, progress io.Writer, m *meter) (Result, error) {
	const name = "DELAYD_BENCH_SCHEDULES"
	drop, err := clients[0].benchStream(ctx, name, []string{"bench.sched.>"}, true)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	prefix := "j" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	rec := newRecorder(w.Count)
	stop, err := clients[0].watchStream(ctx, name, "bench.sched.out.>", "Bench-Id", "Bench-Due", watchInto(rec, prefix))
	if err != nil {
		return Result{}, err
	}
	defer stop()
	payload := payloadOf(w.PayloadSize)
	atStart := m.take(ctx)
	start := time.Now()
	var acked atomic.Int64
	done := startReport(progress, w.Count, &acked, rec)
	took, failed, first, err := publishShared(ctx, clients, w.Count, o.Window, func(i int) outgoing {
		at := w.dueAt(start, i)
		h := scheduleHeaders(at, "bench.sched.out."+strconv.Itoa(i))
		h["Bench-Id"] = []string{prefix + strconv.Itoa(i)}
		h["Bench-Due"] = []string{at.UTC().Format(time.RFC3339Nano)}
		return outgoing{Subject: "bench.sched.in." + strconv.Itoa(i), Header: h, Data: payload}
	}, &acked)
	if err != nil {
		done()
		return Result{}, err
	}
	want := w.Count - failed
	stored := m.take(ctx)
	r, delivered := waitDeliveries(ctx, rec, w, start, want, done, m)
	r.setCPU(atStart, stored, delivered, want)
	r.Mode = ModeSchedules
	r.IntakeSeconds = took.Seconds()
	r.IntakeRate = float64(want) / took.Seconds()
	r.PubAckRate = r.IntakeRate
	r.Rejected, r.FirstRejection = failed, first
	if o.OneRequester > 0 {
		one, err := schedulesOneRequester(ctx, clients[0], w, o.OneRequester)
		if err != nil {
			return Result{}, fmt.Errorf("one requester: %w", err)
		}
		r.OneRequester = &one
	}
	return r, nil
}

// waitDeliveries waits until want envelopes arrived or the grace after the
// last due time ended, and returns the counts and lateness, and m's
// reading once they arrived.
func waitDeliveries(ctx context.Context, rec *recorder, w Workload, start time.Time, want int, done func(), m *meter) (Result, map[string]float64) {
	deadline := start.Add(w.Lead + w.Window + w.Grace)
	for rec.unique() < want && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	end := m.take(ctx)
	time.Sleep(100 * time.Millisecond) // let late duplicates show up
	done()
	r := rec.result()
	r.Count, r.Concurrency, r.PayloadBytes, r.DueRate = w.Count, w.Concurrency, w.PayloadSize, w.DueRate()
	r.Lost = want - r.Delivered
	return r, end
}

// PrintCompare writes results side by side.
func PrintCompare(w io.Writer, rs []Result) {
	if len(rs) == 0 {
		return
	}
	r0 := rs[0]
	fmt.Fprintf(w, "\nworkload   %d envelopes, %d-byte payloads, %.0f due/s, same run\n\n", r0.Count, r0.PayloadBytes, r0.DueRate)
	row := func(label string, f func(Result) string) {
		fmt.Fprintf(w, "%-24s", label)
		for _, r := range rs {
			fmt.Fprintf(w, "%22s", f(r))
		}
		fmt.Fprintln(w)
	}
	row("", label)
	row("intake /s", func(r Result) string { return fmt.Sprintf("%.0f", r.IntakeRate) })
	row("PubAck /s", func(r Result) string {
		if r.PubAckRate == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", r.PubAckRate)
	})
	row("baseline /s (ratio)", func(r Result) string {
		if r.BaselineRate == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f (%.2f)", r.BaselineRate, r.IntakeRatio)
	})
	row("publish failed", func(r Result) string { return strconv.Itoa(r.Rejected) })
	row("delivered", func(r Result) string { return strconv.Itoa(r.Delivered) })
	row("lost / dup / early", func(r Result) string { return fmt.Sprintf("%d / %d / %d", r.Lost, r.Duplicates, r.Early) })
	row("lateness p50 ms", func(r Result) string { return fmt.Sprintf("%.2f", r.LatenessMs.P50) })
	row("lateness p90 ms", func(r Result) string { return fmt.Sprintf("%.2f", r.LatenessMs.P90) })
	row("lateness p99 ms", func(r Result) string { return fmt.Sprintf("%.2f", r.LatenessMs.P99) })
	row("lateness max ms", func(r Result) string { return fmt.Sprintf("%.2f", r.LatenessMs.Max) })
	if r0.OneRequester == nil {
		return
	}
	fmt.Fprintf(w, "\none requester alone, µs per call (mean of %d in a row; echo: a trivial responder on the same server, same run)\n\n", r0.OneRequester.Calls)
	row("", func(r Result) string { return r.Mode })
	one := func(f func(OneRequester) string) func(Result) string {
		return func(r Result) string {
			if r.OneRequester == nil {
				return "-"
			}
			return f(*r.OneRequester)
		}
	}
	row("echo", one(func(o OneRequester) string { return fmt.Sprintf("%.0f", o.EchoUs) }))
	row("schedule call", one(func(o OneRequester) string { return fmt.Sprintf("%.0f (%.1f× echo)", o.Us, o.Us/o.EchoUs) }))
}
