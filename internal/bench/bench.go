// Package bench drives a delayd through its public protocol and measures
// what users choose a delay service on: intake rate, lateness and loss.
package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/client"
)

// Workload describes one run.
type Workload struct {
	Count       int
	Concurrency int
	PayloadSize int
	// Lead is the time from the start of the run to the first due time;
	// Window is the span the due times are spread evenly over, so the due
	// rate is Count/Window.
	Lead    time.Duration
	Window  time.Duration
	Target  string
	Timeout time.Duration // per request
	// Grace is how long to wait after the last due time for stragglers
	// before counting the rest as lost.
	Grace time.Duration
}

// DueRate is the envelopes per second falling due.
func (w Workload) DueRate() float64 { return float64(w.Count) / w.Window.Seconds() }

// Result is what a run measured.
type Result struct {
	Mode          string  `json:"mode"`
	Count         int     `json:"count"`
	Concurrency   int     `json:"concurrency"`
	PayloadBytes  int     `json:"payload_bytes"`
	DueRate       float64 `json:"due_per_second"`
	IntakeSeconds float64 `json:"intake_seconds"`
	IntakeRate    float64 `json:"intake_per_second"`
	// PubAckRate is, for JetStream runs, the rate of PubAcks (for the
	// stream intake, before the envelopes are all in Redis).
	PubAckRate   float64 `json:"puback_per_second,omitempty"`
	BaselineRate float64 `json:"baseline_per_second,omitempty"`
	IntakeRatio  float64 `json:"intake_ratio_of_baseline,omitempty"`
	Rejected     int     `json:"rejected"`
	// FirstRejection is the first failed request or publish ("" for none).
	FirstRejection string `json:"first_rejection,omitempty"`
	// Batch is the envelopes per batch request (ModeBatch) or the
	// batching client's most per batch (ModeClientBatching); IntakeRate
	// counts envelopes, BaselineRate the echo's requests.
	Batch      int    `json:"batch,omitempty"`
	Delivered  int    `json:"delivered"`
	Lost       int    `json:"lost"`
	Duplicates int    `json:"duplicates"`
	Early      int    `json:"early"`
	LatenessMs Quant  `json:"lateness_ms"`
	Histogram  []Bar  `json:"histogram"`
	Daemon     *Usage `json:"daemon,omitempty"`
	// Redis is Redis' CPU per envelope (--local), from the split.
	Redis *RedisUsage `json:"redis,omitempty"`
	// CPU is the CPU each process used per envelope (cpu.go), and
	// BaselineCPU per message of the baseline.
	CPU         *CPUSplit          `json:"cpu_us,omitempty"`
	BaselineCPU map[string]float64 `json:"baseline_cpu_us,omitempty"`
	// OneRequester is one requester's cost per call, alone (--compare).
	OneRequester *OneRequester `json:"one_requester,omitempty"`
}

// Quant are lateness quantiles in milliseconds.
type Quant struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Bar is one histogram bucket: deliveries whose lateness is below UpToMs
// (and at or above the previous bucket's bound).
type Bar struct {
	UpToMs float64 `json:"up_to_ms"`
	Count  int     `json:"count"`
}

// Usage is the resource use of a delayd process the bench started.
type Usage struct {
	CPUSeconds float64 `json:"cpu_seconds"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
}

// RedisUsage is the CPU Redis' main thread used per envelope: from the
// first request until the last was answered (storing), then until the
// last delivery arrived (claims and settles). Redis' whole CPU is read, so
// it means that only with a Redis the bench has to itself, and a --lead
// longer than the intake (else deliveries begin while requests are sent).
type RedisUsage struct {
	CPUMicrosPerSchedule float64 `json:"cpu_us_per_schedule"`
	CPUMicrosPerDelivery float64 `json:"cpu_us_per_delivery"`
}

// baseline measures the request/reply ceiling: the same requests, same
// concurrency, answered at once by a trivial responder.
func baseline(ctx context.Context, clients []*conn, w Workload, m *meter) (float64, map[string]float64, error) {
	echo := clients[0].withSubject("delayd-bench-echo")
	stop, err := echo.echo("delayd-bench-echo.schedule")
	if err != nil {
		return 0, nil, err
	}
	defer stop()
	echoes := make([]*conn, len(clients))
	for i, c := range clients {
		echoes[i] = c.withSubject("delayd-bench-echo")
	}
	before := m.take(ctx)
	d, rejected, _, err := schedule(ctx, echoes, w, sendMode{}, "echo", time.Now(), nil)
	if err != nil {
		return 0, nil, err
	}
	return float64(w.Count-rejected) / d.Seconds(), perUnit(before, m.take(ctx), w.Count-rejected), nil
}

// runRequest schedules the workload through delayd and watches the target until
// every envelope arrived or the grace period after the last due time ended.
func runRequest(ctx context.Context, clients []*conn, w Workload, how sendMode, progress io.Writer, m *meter) (Result, error) {
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "b" + runID + "-"
	rec := newRecorder(w.Count)
	stop, err := clients[0].watch(w.Target, watchInto(rec, prefix))
	if err != nil {
		return Result{}, err
	}
	defer stop()

	atStart := m.take(ctx)
	start := time.Now()
	var scheduled atomic.Int64
	done := startReport(progress, w.Count, &scheduled, rec)
	took, rejected, first, err := schedule(ctx, clients, w, how, prefix, start, &scheduled)
	if err != nil {
		done()
		return Result{}, err
	}
	stored := m.take(ctx)
	deadline := start.Add(w.Lead + w.Window + w.Grace)
	for rec.unique() < w.Count-rejected && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	delivered := m.take(ctx)
	time.Sleep(100 * time.Millisecond) // let late duplicates show up
	done()

	r := rec.result()
	r.Mode, r.Batch = how.mode(), how.batch
	r.Count, r.Concurrency, r.PayloadBytes, r.DueRate = w.Count, w.Concurrency, w.PayloadSize, w.DueRate()
	r.IntakeSeconds = took.Seconds()
	r.IntakeRate = float64(w.Count-rejected) / took.Seconds()
	r.Rejected, r.FirstRejection = rejected, first
	r.Lost = w.Count - rejected - r.Delivered
	r.setCPU(atStart, stored, delivered, w.Count-rejected)
	return r, nil
}

// setCPU sets the run's CPU split from the readings at its start, once
// its envelopes were stored (intake units of them), and once they were
// delivered; and Redis' share on its own, as RedisUsage.
func (r *Result) setCPU(start, stored, delivered map[string]float64, intake int) {
	split := CPUSplit{Intake: perUnit(start, stored, intake), Delivery: perUnit(stored, delivered, r.Delivered)}
	if split.Intake != nil || split.Delivery != nil {
		r.CPU = &split
	}
	s, okS := split.Intake[ProcRedis]
	d, okD := split.Delivery[ProcRedis]
	if okS && okD {
		r.Redis = &RedisUsage{CPUMicrosPerSchedule: s, CPUMicrosPerDelivery: d}
	}
}

// sendMode is how the requesters send: one request per envelope (the
// zero value), batch requests of batch envelopes, or single Schedule calls
// through a client that batches them (clientBatching, at most batch each).
type sendMode struct {
	batch          int
	clientBatching bool
}

func (s sendMode) mode() string {
	switch {
	case s.clientBatching:
		return ModeClientBatching
	case s.batch > 0:
		return ModeBatch
	}
	return ModeRequest
}

// schedule sends Count envelopes over Concurrency workers. Envelope i is
// due at start+Lead+i*Window/Count, given as Delayd-At so the due time
// does not depend on how fast the intake was.
func schedule(ctx context.Context, clients []*conn, w Workload, how sendMode, prefix string, start time.Time, counter *atomic.Int64) (time.Duration, int, string, error) {
	if how.clientBatching {
		// One batching client that every requester shares, as an
		// application has one: the more callers it gathers, the larger
		// its batches. Its connection carries few messages.
		c := clients[0]
		shared := &conn{nc: c.nc, subject: c.subject,
			delayd: client.New(c.nc, client.Prefix(c.subject), client.Batching(how.batch, client.MaxLinger))}
		defer shared.delayd.Close()
		clients = []*conn{shared}
	} else if how.batch > 0 {
		return scheduleBatches(ctx, clients, w, how.batch, prefix, start, counter)
	}
	payload := make([]byte, w.PayloadSize)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var next atomic.Int64
	var rejected atomic.Int64
	// A pointer, not an atomic.Value: errors of different types would
	// make Value's CompareAndSwap panic.
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range w.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[k%len(clients)]
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= w.Count {
					return
				}
				at := start.Add(w.Lead + time.Duration(int64(w.Window)*int64(i)/int64(w.Count)))
				rctx, cancel := context.WithTimeout(ctx, w.Timeout)
				_, err := c.delayd.Schedule(rctx, w.Target, payload, client.At(at), client.ID(prefix+strconv.Itoa(i)))
				cancel()
				if err != nil {
					rejected.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				}
				if counter != nil {
					counter.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return outcome(time.Since(t0), &rejected, &firstErr, w.Count, "request")
}

// scheduleBatches is schedule with batch requests: each worker takes the
// next n envelopes and sends them with ScheduleBatch.
func scheduleBatches(ctx context.Context, clients []*conn, w Workload, n int, prefix string, start time.Time, counter *atomic.Int64) (time.Duration, int, string, error) {
	payload := make([]byte, w.PayloadSize)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var next, rejected atomic.Int64
	var firstErr atomic.Pointer[error]
	fail := func(k int, err error) {
		rejected.Add(int64(k))
		firstErr.CompareAndSwap(nil, &err)
	}
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range w.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[k%len(clients)]
			envs := make([]client.Envelope, 0, n)
			for ctx.Err() == nil {
				i0 := int(next.Add(int64(n))) - n
				if i0 >= w.Count {
					return
				}
				envs = envs[:0]
				for i := i0; i < min(i0+n, w.Count); i++ {
					at := start.Add(w.Lead + time.Duration(int64(w.Window)*int64(i)/int64(w.Count)))
					envs = append(envs, client.Envelope{Target: w.Target, Payload: payload,
						Options: []client.ScheduleOption{client.At(at), client.ID(prefix + strconv.Itoa(i))}})
				}
				rctx, cancel := context.WithTimeout(ctx, w.Timeout)
				res, err := c.delayd.ScheduleBatch(rctx, envs)
				cancel()
				if err != nil {
					fail(len(envs), err)
				}
				for _, r := range res {
					if r.Err != nil {
						fail(1, r.Err)
					}
				}
				if counter != nil {
					counter.Add(int64(len(envs)))
				}
			}
		}()
	}
	wg.Wait()
	return outcome(time.Since(t0), &rejected, &firstErr, w.Count, "envelope")
}

// outcome is what a schedule run returns: its time, how many were
// rejected and the first rejection, and an error when every one (each a
// request or an envelope) was.
func outcome(took time.Duration, rejected *atomic.Int64, firstErr *atomic.Pointer[error], count int, each string) (time.Duration, int, string, error) {
	first := ""
	if p := firstErr.Load(); p != nil {
		first = (*p).Error()
	}
	n := rejected.Load()
	if n == int64(count) {
		return took, int(n), first, fmt.Errorf("bench: every %s failed, first: %s", each, first)
	}
	return took, int(n), first, nil
}

// recorder keeps the first lateness of each envelope and counts copies.
type recorder struct {
	mu       sync.Mutex
	lateness []time.Duration
	copies   []uint16
	uniq     int
	total    int
	recent   []time.Duration // since the last progress line
}

func newRecorder(n int) *recorder {
	return &recorder{lateness: make([]time.Duration, n), copies: make([]uint16, n)}
}

func (r *recorder) add(i int, late time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 || i >= len(r.copies) {
		return
	}
	r.total++
	r.copies[i]++
	if r.copies[i] == 1 {
		r.uniq++
		r.lateness[i] = late
		r.recent = append(r.recent, late)
	}
}

func (r *recorder) unique() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.uniq
}

// takeRecent returns the deliveries since the last call, for progress.
func (r *recorder) takeRecent() (int, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.recent
	r.recent = nil
	return r.uniq, rec
}

// buckets are the histogram bounds in ms: fine where delayd should be,
// coarse where the peers are.
var buckets = []float64{0.5, 1, 2, 3, 5, 10, 20, 50, 100, 250, 500, 1000, 5000}

func (r *recorder) result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res Result
	var ls []time.Duration
	for i, c := range r.copies {
		if c == 0 {
			continue
		}
		res.Delivered++
		res.Duplicates += int(c) - 1
		if r.lateness[i] < 0 {
			res.Early++
		}
		ls = append(ls, r.lateness[i])
	}
	res.LatenessMs = quantiles(ls)
	res.Histogram = histogram(ls)
	return res
}

func quantiles(ls []time.Duration) Quant {
	if len(ls) == 0 {
		return Quant{}
	}
	slices.Sort(ls)
	q := func(p float64) float64 { return ms(ls[min(len(ls)-1, int(p*float64(len(ls))))]) }
	return Quant{P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: ms(ls[len(ls)-1])}
}

func histogram(ls []time.Duration) []Bar {
	bars := make([]Bar, len(buckets)+1)
	for i, b := range buckets {
		bars[i].UpToMs = b
	}
	bars[len(buckets)].UpToMs = -1 // open-ended
	for _, l := range ls {
		v := ms(l)
		i, _ := slices.BinarySearch(buckets, v)
		if i < len(buckets) && buckets[i] == v {
			i++
		}
		bars[i].Count++
	}
	return bars
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// startReport prints the progress line to w every 0.5 s until the
// returned function is called; that function returns once the reporter
// wrote its last line, so the caller may write to w after it.
func startReport(w io.Writer, total int, scheduled *atomic.Int64, rec *recorder) (done func()) {
	stop, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		report(w, total, scheduled, rec, stop)
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(stop) })
		<-finished
	}
}

func report(w io.Writer, total int, scheduled *atomic.Int64, rec *recorder, done <-chan struct{}) {
	if w == nil {
		return
	}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			fmt.Fprintln(w)
			return
		case <-t.C:
			got, recent := rec.takeRecent()
			q := quantiles(recent)
			fmt.Fprintf(w, "\rscheduled %d/%d  delivered %d  lateness (last 0.5 s) p50 %.1f ms p99 %.1f ms   ",
				scheduled.Load(), total, got, q.P50, q.P99)
		}
	}
}

// watchInto records the deliveries of ids "<prefix><n>" of a run.
func watchInto(rec *recorder, prefix string) func(delivered) {
	return func(d delivered) {
		i, ok := strings.CutPrefix(d.ID, prefix)
		if !ok {
			return
		}
		n, err := strconv.Atoi(i)
		if err != nil {
			return
		}
		rec.add(n, d.Received.Sub(d.Due))
	}
}
