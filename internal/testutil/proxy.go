package testutil

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is one way through a Proxy.
type Direction int

// The two directions: Up is client to server, Down is server to client.
const (
	Up Direction = iota
	Down
)

// Fault is what a Proxy does to the bytes going one way.
type Fault struct {
	// Latency delays every chunk, keeping their order.
	Latency time.Duration
	// Stall holds every chunk until the fault is changed.
	Stall bool
	// Drop discards every chunk (the connection stays up).
	Drop bool
	// CutAfter, if positive, lets that many more bytes through on each
	// connection, then closes it: a cut in the middle of a pipeline.
	CutAfter int
	// Blackhole holds every chunk, like Stall, and hides a close of the
	// other side: while it lasts, both sockets stay open and silent, as
	// behind a dead switch or a paused VM (no FIN, no RST passes either).
	// Lifted, what was held goes on, as TCP retransmits it.
	Blackhole bool
}

// Proxy is a TCP proxy in front of a real server, for injecting network
// faults per direction: latency, stalls, dropped bytes and cuts.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	mu     sync.Mutex
	faults [2]Fault
	change chan struct{} // closed and replaced when faults change
	conns  map[net.Conn]struct{}
	done   chan struct{} // closed by Close
	close  sync.Once
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: target, change: make(chan struct{}), conns: map[net.Conn]struct{}{},
		done: make(chan struct{})}
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set changes the fault of one direction, for open and new connections.
func (p *Proxy) Set(d Direction, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[d] = f
	close(p.change)
	p.change = make(chan struct{})
}

// Blackhole holds every byte both ways, on open and new connections,
// keeping the sockets open: a silent path until Clear.
func (p *Proxy) Blackhole() {
	p.Set(Up, Fault{Blackhole: true})
	p.Set(Down, Fault{Blackhole: true})
}

// Clear removes every fault.
func (p *Proxy) Clear() {
	p.Set(Up, Fault{})
	p.Set(Down, Fault{})
}

// Cut closes every open connection at once; new ones are accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.close.Do(func() { close(p.done) })
	_ = p.ln.Close()
	p.Cut()
}

func (p *Proxy) fault(d Direction) (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[d], p.change
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		closeBoth := sync.OnceFunc(func() {
			_ = client.Close()
			_ = server.Close()
			p.track(client, false)
			p.track(server, false)
		})
		go p.pipe(Up, client, server, closeBoth)
		go p.pipe(Down, server, client, closeBoth)
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through the direction's fault: a reader queues
// chunks with their delivery time, a writer applies stalls and cuts.
func (p *Proxy) pipe(d Direction, src, dst net.Conn, closeBoth func()) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				f, _ := p.fault(d)
				if !f.Drop {
					q <- chunk{b[:n], time.Now().Add(f.Latency)}
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		// A blackhole hides the end of src from dst until it is lifted:
		// behind a dead switch, no FIN or RST arrives either.
		for f, changed := p.fault(d); f.Blackhole; f, changed = p.fault(d) {
			select {
			case <-changed:
			case <-p.done:
				closeBoth()
				return
			}
		}
		closeBoth()
	}()
	passed := 0
	cutAt := -1
	for c := range q {
		time.Sleep(time.Until(c.at))
		for {
			f, changed := p.fault(d)
			if f.CutAfter > 0 && cutAt < 0 {
				cutAt = passed + f.CutAfter
			}
			if !f.Stall && !f.Blackhole {
				break
			}
			select {
			case <-changed:
			case <-p.done:
				return
			}
		}
		b := c.b
		if cutAt >= 0 && passed+len(b) >= cutAt {
			_, _ = dst.Write(b[:cutAt-passed])
			return
		}
		passed += len(b)
		if _, err := dst.Write(b); err != nil {
			return
		}
	}
}
