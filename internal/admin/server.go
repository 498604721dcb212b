package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness condition; a nil error means ready.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// Server serves /livez, /readyz, /metrics and the console at /ui.
type Server struct {
	srv *http.Server
	ln  net.Listener
	log hclog.Logger
}

// Listen binds addr, so a port conflict fails the start, not later.
// A nil ui leaves the console out.
func Listen(addr string, m *Metrics, checks []Check, ui *UI, log hclog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", addr, err)
	}
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
	if ui != nil {
		ui.register(mux)
	}
	return &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, log: log}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx is done, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	s.log.Info("admin HTTP serving", "addr", s.Addr())
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
