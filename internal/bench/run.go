package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/embedded"
)

// Options are the settings of a bench run beside its Workload: what
// `delayd bench` reads from its flags and config.
type Options struct {
	// NATSURL is the server the bench and delayd meet on. Dial connects to
	// it (with the user's credentials and TLS), Conns times.
	NATSURL string
	Dial    func(url string) (*nats.Conn, error)
	Conns   int
	// Subject is delayd's subject prefix, and StreamName its intake
	// stream's; a child gets its own instead.
	Subject    string
	StreamName string
	// Baseline measures the same workload against a trivial responder (a
	// stream nobody consumes, with Stream) first.
	Baseline bool
	// Stream publishes into the durable intake stream instead of calling
	// schedule.
	Stream bool
	// Compare also runs the workload as JetStream message schedules.
	Compare bool
	// OneRequester is how many calls in a row the Compare one-requester
	// figures take (0: none).
	OneRequester int
	// MaxPending is the most unacknowledged async publishes per
	// connection (Stream, Compare).
	MaxPending int
	// Batch, if positive, sends batch requests of Batch envelopes
	// (ScheduleBatch) instead of one request per envelope.
	Batch int
	// ClientBatching also (or, without Batch, instead) runs Schedule calls
	// through client.Batching (at most Batch envelopes a batch, 100
	// without it; linger client.MaxLinger).
	ClientBatching bool
	// Child, if not nil, is a delayd the bench starts, talks to alone,
	// measures and cleans up after; nil benches the delayd already there.
	Child *ChildOptions
	// Progress receives the progress line and notes (stderr).
	Progress io.Writer
	// NATSPid, if not 0, is nats-server's process, whose CPU the split
	// (CPUSplit) reads beside the others'.
	NATSPid int
}

// Run runs the bench: delayd's result, and beside it (others) the result
// of ClientBatching when Batch is measured too, and with Compare the
// JetStream schedules' result last. A child, its stream and its Redis
// namespace are gone when Run returns, whichever way it returns.
func Run(ctx context.Context, w Workload, o Options) (Result, []Result, error) {
	subject, streamName := o.Subject, o.StreamName
	var ch *child
	var conns []*conn
	closeConns := func() {
		for _, c := range conns {
			c.nc.Close()
		}
	}
	if o.Child != nil {
		id := newIdentity()
		subject, streamName = id.subject, id.stream
		var err error
		if ch, err = startChild(*o.Child, o.NATSURL, id, o.Stream); err != nil {
			return Result{}, nil, err
		}
		// The clean-up, in this order on every way out: the child first (a
		// running child would set its stream up again and write its keys
		// again), then its stream, then its namespace: both were the
		// bench's alone, and what they hold (lease hashes, the member
		// list, anything not delivered after an interrupt) must not stay
		// on the user's servers.
		defer func() {
			ch.kill()
			if o.Stream && len(conns) > 0 {
				deleteChildStream(conns[0], streamName, o.Progress)
			}
			closeConns()
			if !o.Child.Embedded && o.Child.DropNamespace != nil {
				dropNamespace(o.Child.DropNamespace, id.namespace, o.Progress)
			}
		}()
	} else {
		defer closeConns()
	}
	for range o.Conns {
		nc, err := o.Dial(o.NATSURL)
		// A child started with --embedded brings the NATS server up itself.
		for deadline := time.Now().Add(15 * time.Second); err != nil && ch != nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			nc, err = o.Dial(o.NATSURL)
		}
		if err != nil {
			return Result{}, nil, err
		}
		conns = append(conns, newConn(nc, subject))
	}
	return run(ctx, w, o, conns, subject, streamName, ch)
}

// run is Run once the connections are up.
func run(ctx context.Context, w Workload, o Options, conns []*conn, subject, streamName string, ch *child) (Result, []Result, error) {
	if w.Target == subject || len(w.Target) > len(subject) && w.Target[:len(subject)+1] == subject+"." {
		// The service refuses its own subjects as targets.
		w.Target = "bench.target"
	}
	if err := waitService(ctx, conns[0], ch); err != nil {
		return Result{}, nil, err
	}
	so := streamOptions{Prefix: subject, Window: o.MaxPending}
	m := newMeter(processes(o, ch)...)
	var base float64
	var baseCPU map[string]float64
	var err error
	if o.Baseline {
		if o.Stream {
			base, baseCPU, err = streamBaseline(ctx, conns, w, so, m)
		} else {
			base, baseCPU, err = baseline(ctx, conns, w, m)
		}
		if err != nil {
			return Result{}, nil, fmt.Errorf("baseline: %w", err)
		}
	}
	var r Result
	var others []Result
	if o.Stream {
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = conns[0].waitStream(wctx, streamName)
		cancel()
		if err == nil {
			r, err = runStream(ctx, conns, w, so, o.Progress, m)
		}
	} else {
		modes := []sendMode{{batch: o.Batch}}
		if o.ClientBatching {
			size := o.Batch
			if size < 1 {
				size = 100
			}
			if o.Batch > 0 {
				modes = append(modes, sendMode{batch: size, clientBatching: true})
			} else {
				modes = []sendMode{{batch: size, clientBatching: true}}
			}
		}
		for i, how := range modes {
			var ri Result
			if ri, err = runRequest(ctx, conns, w, how, o.Progress, m); err != nil {
				break
			}
			if base > 0 {
				ri.BaselineRate, ri.IntakeRatio, ri.BaselineCPU = base, ri.IntakeRate/base, baseCPU
			}
			if i == 0 {
				r = ri
			} else {
				others = append(others, ri)
			}
		}
	}
	if err != nil {
		return Result{}, nil, err
	}
	if base > 0 {
		r.BaselineRate, r.IntakeRatio, r.BaselineCPU = base, r.IntakeRate/base, baseCPU
	}
	if n := o.OneRequester; o.Compare && n > 0 {
		// What one call costs a requester alone, beside JetStream's below.
		one, err := delaydOneRequester(ctx, conns[0], w, n)
		if err != nil {
			return Result{}, nil, fmt.Errorf("one requester: %w", err)
		}
		r.OneRequester = &one
		so.OneRequester = n
	}
	if ch != nil {
		if r.Daemon, err = ch.stop(); err != nil {
			return Result{}, nil, err
		}
	}
	if !o.Compare {
		return r, others, nil
	}
	embeddedChild := o.Child != nil && o.Child.Embedded
	// JetStream schedules touch neither the child (gone by now) nor Redis.
	peer, err := compare(ctx, w, so, conns, embeddedChild, o.Progress, m.only(ProcNATS, ProcBench))
	if err != nil {
		return Result{}, nil, fmt.Errorf("compare: %w", err)
	}
	return r, append(others, *peer), nil
}

// processes are the CPU sources of a run beside the bench itself: Redis'
// main thread and the delayd child (not an embedded one: its Redis is an
// emulation inside it), and nats-server when its pid was given.
func processes(o Options, ch *child) []cpuSource {
	var out []cpuSource
	if o.Child != nil && !o.Child.Embedded {
		out = append(out, cpuSource{ProcRedis, o.Child.RedisCPU})
	}
	if ch != nil {
		out = append(out, cpuSource{ProcDelayd, procCPU(ch.cmd.Process.Pid)})
	}
	if o.NATSPid > 0 {
		out = append(out, cpuSource{ProcNATS, procCPU(o.NATSPid)})
	}
	return out
}

// deleteChildStream deletes the child's own intake stream, once the child
// is gone.
func deleteChildStream(c *conn, name string, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.deleteStream(ctx, name); err != nil {
		fmt.Fprintf(stderr, "delayd bench: deleting the child's stream %s: %v\n", name, err)
	}
}

// dropNamespace deletes the keys of the child's namespace ns, once the
// child is gone.
func dropNamespace(drop func(context.Context, string) error, ns string, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := drop(ctx, ns); err != nil {
		fmt.Fprintf(stderr, "delayd bench: the child's Redis keys ({%s:*}) were not deleted: %v\n", ns, err)
	}
}

// compare runs the workload as JetStream message schedules: on the server
// delayd uses when it runs them (2.12 or newer), so both sides pay the
// same NATS, else on an in-process nats-server of its own. An embedded
// child's server stopped with the child.
func compare(ctx context.Context, w Workload, so streamOptions, same []*conn, embeddedChild bool, progress io.Writer, m *meter) (*Result, error) {
	if !embeddedChild && same[0].hasSchedules(ctx) {
		fmt.Fprintln(progress, "compare: JetStream schedules on delayd's nats-server")
		r, err := schedules(ctx, same, w, so, progress, m)
		return &r, err
	}
	if embeddedChild {
		fmt.Fprintln(progress, "compare: the embedded child's nats-server stopped with it: JetStream schedules on an in-process nats-server (a different server: compare each with its own echo)")
	} else {
		fmt.Fprintln(progress, "compare: delayd's nats-server has no message schedules (2.12+): JetStream schedules on an in-process nats-server (a different server: compare each with its own echo)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	url := "nats://" + l.Addr().String()
	l.Close()
	srv, err := embedded.Start(url)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	conns := make([]*conn, len(same))
	for i := range conns {
		nc, err := nats.Connect(url, nats.Name("delayd-cli"), nats.Timeout(w.Timeout))
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		conns[i] = newConn(nc, "bench")
	}
	// The in-process server's CPU is the bench's own: no split.
	r, err := schedules(ctx, conns, w, so, progress, nil)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// waitService waits until a delayd answers, so a just-started child is
// not measured while it connects. With a child, only the child can answer
// (its own subject prefix), and a child that exits first ends the bench
// before anything was sent.
func waitService(ctx context.Context, c *conn, ch *child) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if ch != nil {
			if err := ch.exitedEarly(); err != nil {
				return err
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := c.delayd.Cancel(rctx, "bench-probe")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no delayd answers: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
