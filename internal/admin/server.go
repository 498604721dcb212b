package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness condition; a nil error means ready.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// Server is one HTTP listener: the probes and metrics (Listen), or the
// console (ListenUI). They are separate so that the probes can face the
// pod network for the kubelet and Prometheus while the console, which
// shows stored messages, stays on loopback.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	log  hclog.Logger
	what string // logged at start
}

// Listen binds addr for /livez, /readyz and /metrics, so a port conflict
// fails the start, not later.
func Listen(addr string, m *Metrics, checks []Check, log hclog.Logger) (*Server, error) {
	mux := http.NewServeMux()
	// Liveness never looks at Redis or NATS: an outage of either must not
	// make Kubernetes restart every sidecar at once.
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		for _, c := range checks {
			if err := c.Fn(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %s: %v\n", c.Name, err)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	return listen(addr, mux, "probes and metrics", log)
}

// ListenUI binds addr for the console and its API at /ui.
func ListenUI(addr string, ui *UI, log hclog.Logger) (*Server, error) {
	mux := http.NewServeMux()
	ui.register(mux)
	s, err := listen(addr, mux, "console", log)
	if err != nil {
		return nil, err
	}
	if ip := s.ln.Addr().(*net.TCPAddr).IP; ip.IsLoopback() {
		// DNS rebinding: a web page on evil.example that re-points its name
		// at 127.0.0.1 would otherwise read the console from the browser
		// of anyone on this machine. Loopback is reached by loopback names.
		s.srv.Handler = loopbackHostOnly(mux)
	}
	return s, nil
}

// loopbackHostOnly refuses requests whose Host names anything but this
// machine: localhost or a loopback address.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip := net.ParseIP(strings.Trim(host, "[]"))
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, "the console on a loopback address answers only to localhost, 127.0.0.1 or [::1]", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func listen(addr string, mux *http.ServeMux, what string, log hclog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s for the %s: %w", addr, what, err)
	}
	return &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, log: log, what: what}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the base URL of the bound address; an address listening on every
// interface is shown as localhost, which reaches it from this machine.
func (s *Server) URL() string {
	a := s.ln.Addr().(*net.TCPAddr)
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// Run serves until ctx is done, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	if s.what == "console" {
		s.log.Info("console at "+s.URL()+"/ui/", "addr", s.Addr())
	} else {
		s.log.Info("admin HTTP serving", "serves", s.what, "addr", s.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin: shutdown: %w", err)
	}
	return nil
}
