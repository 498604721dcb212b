package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Persistence is what a Redis server says about keeping delayd's data.
// Empty fields are unknown (the server did not say).
type Persistence struct {
	// EvictionPolicy is maxmemory-policy. Anything but noeviction lets
	// Redis delete acknowledged envelopes when memory runs short.
	EvictionPolicy string
	AppendOnly     string // yes | no
	AppendFsync    string // always | everysec | no
	Save           string // RDB snapshot rules, "" for none
}

// Conn is a client or one connection (go-redis OnConnect hands one).
type Conn interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Info(ctx context.Context, sections ...string) *redis.StringCmd
}

// ReadPersistence asks c for its persistence settings, with CONFIG GET
// where allowed and INFO (which managed Redis services keep open) for what
// CONFIG GET would not give.
func ReadPersistence(ctx context.Context, c Conn) (Persistence, error) {
	var p Persistence
	// Several names in one CONFIG GET need Redis 7; older servers and
	// refused CONFIG fall through to INFO.
	cfg := redis.NewCmd(ctx, "CONFIG", "GET", "maxmemory-policy", "appendonly", "appendfsync", "save")
	if err := c.Process(ctx, cfg); err == nil {
		kv := map[string]string{}
		switch v := cfg.Val().(type) {
		case map[any]any: // RESP3
			for k, x := range v {
				kv[fmt.Sprint(k)] = fmt.Sprint(x)
			}
		case []any: // RESP2: name, value pairs
			for i := 0; i+1 < len(v); i += 2 {
				kv[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
			}
		}
		p.EvictionPolicy, p.AppendOnly, p.AppendFsync, p.Save = kv["maxmemory-policy"], kv["appendonly"], kv["appendfsync"], kv["save"]
	}
	if p.EvictionPolicy == "" || p.AppendOnly == "" {
		info, err := c.Info(ctx, "memory", "persistence").Result()
		if err != nil && p.EvictionPolicy == "" {
			return p, fmt.Errorf("store: read maxmemory-policy: %w", err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			switch {
			case !ok:
			case k == "maxmemory_policy" && p.EvictionPolicy == "":
				p.EvictionPolicy = v
			case k == "aof_enabled" && p.AppendOnly == "":
				p.AppendOnly = map[string]string{"1": "yes", "0": "no"}[v]
			}
		}
	}
	if p.EvictionPolicy == "" {
		return p, fmt.Errorf("store: Redis did not report its maxmemory-policy")
	}
	return p, nil
}

// Evicts reports whether Redis may delete keys on its own.
func (p Persistence) Evicts() bool { return p.EvictionPolicy != "noeviction" }

// LossWindow says which acknowledged envelopes a crash of Redis itself
// (not of delayd) can lose with these settings.
func (p Persistence) LossWindow() string {
	switch {
	case p.AppendOnly == "yes" && p.AppendFsync == "always":
		return "none: every write is on disk before Redis answers"
	case p.AppendOnly == "yes" && p.AppendFsync == "everysec":
		return "about the last second of writes"
	case p.AppendOnly == "yes":
		return "the writes the OS has not flushed yet (appendfsync " + p.AppendFsync + ", typically up to 30 s)"
	case p.AppendOnly == "no" && p.Save != "":
		return "every write since the last RDB snapshot (save " + p.Save + ")"
	case p.AppendOnly == "no":
		return "everything: no AOF and no RDB snapshots"
	}
	return "unknown (Redis did not report appendonly)"
}

// Guard checks every new Redis connection (so every node, and again after
// every reconnect or failover), and the client every guardEvery, for a
// maxmemory-policy that evicts. Unless eviction is allowed, the first such
// finding ends Run with an error and the daemon stops: an evicting Redis
// loses acknowledged envelopes silently.
type Guard struct {
	allow bool
	log   hclog.Logger
	bad   chan error
	mu    sync.Mutex
	last  Persistence // last logged, to log changes once
	warn  bool        // logged that the settings cannot be read
}

// NewGuard returns a guard; allowEviction downgrades an evicting policy
// to a warning.
func NewGuard(allowEviction bool, log hclog.Logger) *Guard {
	return &Guard{allow: allowEviction, log: log, bad: make(chan error, 1)}
}

// OnConnect is the go-redis hook. It never fails the connection: a Redis
// that will not say its settings (CONFIG and INFO refused) is warned about.
func (g *Guard) OnConnect(ctx context.Context, cn *redis.Conn) error {
	g.Check(ctx, cn)
	return nil
}

// Check reads c's settings, logs them when they change, and reports an
// evicting policy. It returns the error it reported, if any.
func (g *Guard) Check(ctx context.Context, c Conn) error {
	p, err := ReadPersistence(ctx, c)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		if !g.warn {
			g.log.Warn("cannot read Redis persistence settings; make sure maxmemory-policy is noeviction", "error", err)
			g.warn = true
		}
		return nil
	}
	if p != g.last {
		g.last = p
		g.log.Info("Redis persistence", "maxmemory-policy", p.EvictionPolicy, "appendonly", p.AppendOnly,
			"appendfsync", p.AppendFsync, "save", p.Save, "loss window on a Redis crash", p.LossWindow())
		if p.Evicts() && g.allow {
			g.log.Warn("REDIS MAY EVICT KEYS: maxmemory-policy is " + p.EvictionPolicy + "; acknowledged envelopes can be lost without a trace (allowed by redis.allow_eviction)")
		}
	}
	if p.Evicts() && !g.allow {
		err := fmt.Errorf("store: Redis maxmemory-policy is %q: it may delete acknowledged envelopes; set maxmemory-policy noeviction (or redis.allow_eviction: true to accept the loss)", p.EvictionPolicy)
		select {
		case g.bad <- err:
		default:
		}
		return err
	}
	return nil
}

// guardEvery is how often Run re-reads the settings: a policy changed with
// CONFIG SET on a live Redis opens no new connection.
const guardEvery = 10 * time.Second

// Run re-checks c every guardEvery until an evicting policy is found, and
// returns it as an error.
func (g *Guard) Run(ctx context.Context, c Conn) error {
	t := time.NewTicker(guardEvery)
	defer t.Stop()
	for {
		select {
		case err := <-g.bad:
			return err
		case <-ctx.Done():
			return nil
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			g.Check(cctx, c)
			cancel()
		}
	}
}
