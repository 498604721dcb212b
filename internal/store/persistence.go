package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Persistence is what a Redis server says about keeping delayd's data.
// EvictionPolicy and AppendOnly are empty when unknown; AppendFsync and
// Save, which only CONFIG GET tells, say "unknown (why)" when it would not
// (the ACL of docs/security.md refuses it), never "" (which for Save
// means no snapshot rules).
type Persistence struct {
	// EvictionPolicy is maxmemory-policy. Anything but noeviction lets
	// Redis delete acknowledged envelopes when memory runs short.
	EvictionPolicy string `json:"eviction_policy"`
	AppendOnly     string `json:"append_only"`  // yes | no
	AppendFsync    string `json:"append_fsync"` // always | everysec | no | unknown (why)
	Save           string `json:"save"`         // RDB snapshot rules, "" for none, or unknown (why)
	// Snapshots: INFO's rdb_saves says an RDB snapshot was made since
	// Redis started (by its save rules or by hand).
	Snapshots bool `json:"snapshots_since_start"`
}

// unknown is the value of a setting that could not be read, and why.
func unknown(why string) string { return "unknown (" + why + ")" }

// known reports whether a setting's value was read.
func known(v string) bool { return !strings.HasPrefix(v, "unknown (") }

// Conn is a client or one connection (go-redis OnConnect hands one).
type Conn interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Info(ctx context.Context, sections ...string) *redis.StringCmd
}

// ErrPolicyHidden is returned by ReadPersistence when Redis answered but
// would not tell its maxmemory-policy: INFO and CONFIG refused (NOPERM, or
// renamed away by a managed service), or no maxmemory_policy in INFO.
var ErrPolicyHidden = errors.New("store: Redis does not let delayd read its maxmemory-policy")

// errSentinel is returned by ReadPersistence for a connection to a
// sentinel, which holds no data and has no maxmemory-policy.
var errSentinel = errors.New("store: a sentinel, not a data node")

// ReadPersistence asks c for its persistence settings, with CONFIG GET
// where allowed and INFO (which managed Redis services keep open) for what
// CONFIG GET would not give. An error that wraps ErrPolicyHidden means
// Redis will not say; any other means it could not be asked (unreachable,
// a timeout, loading).
func ReadPersistence(ctx context.Context, c Conn) (Persistence, error) {
	var p Persistence
	if sentinel(ctx, c) {
		return p, errSentinel
	}
	// Several names in one CONFIG GET need Redis 7; older servers and
	// refused CONFIG fall through to INFO.
	cfg := redis.NewCmd(ctx, "CONFIG", "GET", "maxmemory-policy", "appendonly", "appendfsync", "save")
	cfgErr := c.Process(ctx, cfg)
	why := "CONFIG GET refused"
	if cfgErr != nil && !refused(cfgErr) {
		why = "CONFIG GET failed"
	}
	p.AppendFsync, p.Save = unknown(why), unknown(why)
	if cfgErr == nil {
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
		p.EvictionPolicy, p.AppendOnly = kv["maxmemory-policy"], kv["appendonly"]
		if v, ok := kv["appendfsync"]; ok {
			p.AppendFsync = v
		} else {
			p.AppendFsync = unknown("not in CONFIG GET")
		}
		if v, ok := kv["save"]; ok {
			p.Save = v
		} else {
			p.Save = unknown("not in CONFIG GET")
		}
	}
	if p.EvictionPolicy == "" || p.AppendOnly == "" || !known(p.Save) {
		info, err := c.Info(ctx, "memory", "persistence").Result()
		if err != nil && p.EvictionPolicy == "" {
			if refused(err) {
				return p, fmt.Errorf("%w: INFO: %v; CONFIG GET: %v", ErrPolicyHidden, err, cfgErr)
			}
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
			case k == "rdb_saves":
				p.Snapshots = v != "0"
			}
		}
	}
	if p.EvictionPolicy == "" {
		return p, fmt.Errorf("%w: INFO has no maxmemory_policy; CONFIG GET: %v", ErrPolicyHidden, cfgErr)
	}
	return p, nil
}

// refused tells a Redis that answered "no" (NOPERM, a command renamed
// away) from one that could not be asked: a network error, a timeout, a
// wrong password, a reply that says to come back later. The second kind
// leaves the guard's state as it was (unknown until a first read), which
// the metric shows, and is asked again.
func refused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	return redis.HasErrorPrefix(err, "NOPERM") || strings.HasPrefix(err.Error(), "ERR unknown command")
}

// sentinel reports whether c is a connection to a sentinel. go-redis runs
// the OnConnect hook on its connections to the sentinels too. HELLO
// without arguments (Redis 6.2 and newer, @connection, which the ACL of
// docs/security.md grants) answers the server's mode; a server that
// refuses it is taken for a data node.
func sentinel(ctx context.Context, c Conn) bool {
	hello := redis.NewCmd(ctx, "HELLO")
	if c.Process(ctx, hello) != nil {
		return false
	}
	switch v := hello.Val().(type) {
	case map[any]any: // RESP3
		return fmt.Sprint(v["mode"]) == "sentinel"
	case []any: // RESP2: name, value pairs
		for i := 0; i+1 < len(v); i += 2 {
			if fmt.Sprint(v[i]) == "mode" {
				return fmt.Sprint(v[i+1]) == "sentinel"
			}
		}
	}
	return false
}

// Evicts reports whether Redis may delete keys on its own.
func (p Persistence) Evicts() bool { return p.EvictionPolicy != "noeviction" }

// LossWindow says which acknowledged envelopes a crash of Redis itself
// (not of delayd) can lose with these settings.
func (p Persistence) LossWindow() string {
	switch {
	case p.AppendOnly == "yes" && !known(p.AppendFsync):
		return "unknown: AOF is on, appendfsync " + p.AppendFsync + ": about the last second of writes with everysec " +
			"(Redis's default), none with always, what the OS has not flushed (typically up to 30 s) with no"
	case p.AppendOnly == "yes" && p.AppendFsync == "always":
		return "none: every write is on disk before Redis answers"
	case p.AppendOnly == "yes" && p.AppendFsync == "everysec":
		return "about the last second of writes"
	case p.AppendOnly == "yes":
		return "the writes the OS has not flushed yet (appendfsync " + p.AppendFsync + ", typically up to 30 s)"
	case p.AppendOnly == "no" && !known(p.Save) && p.Snapshots:
		return "every write since the last RDB snapshot (save rules " + p.Save + "; snapshots were made since Redis started)"
	case p.AppendOnly == "no" && !known(p.Save):
		return "unknown: no AOF, save rules " + p.Save + ": every write since the last RDB snapshot if save rules are set, " +
			"everything if none (no snapshot made since Redis started)"
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
// loses acknowledged envelopes silently. A policy Redis will not tell
// (ErrPolicyHidden) stops the daemon too, unless the options say the
// operator checked it: the guard is never off without saying so.
type Guard struct {
	opt   GuardOptions
	log   hclog.Logger
	bad   chan error
	mu    sync.Mutex
	last  Persistence // last logged, to log changes once
	state string      // one of GuardStates
	warn  string      // the last warning logged, to log each once
}

// GuardOptions are the operator's choices.
type GuardOptions struct {
	// AllowEviction downgrades an evicting policy to a warning.
	AllowEviction bool
	// SkipHidden accepts a Redis that will not tell its policy: the
	// operator has checked it (redis.eviction_check: skip).
	SkipHidden bool
}

// The guard's states, as the delayd_redis_eviction_guard metric exports
// them: on (the policy was read and is noeviction), allowed (it evicts, as
// redis.allow_eviction permits), skipped (Redis will not tell it, as
// redis.eviction_check: skip permits) and unknown (not read yet: Redis
// not reachable since the start).
const (
	GuardOn      = "on"
	GuardAllowed = "allowed"
	GuardSkipped = "skipped"
	GuardUnknown = "unknown"
)

// GuardStates lists the states in the order the metric exports them.
var GuardStates = []string{GuardOn, GuardAllowed, GuardSkipped, GuardUnknown}

// NewGuard returns a guard in state unknown.
func NewGuard(opt GuardOptions, log hclog.Logger) *Guard {
	return &Guard{opt: opt, log: log, bad: make(chan error, 1), state: GuardUnknown}
}

// State is the guard's state, one of GuardStates.
func (g *Guard) State() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// OnConnect is the go-redis hook. It never fails the connection: what it
// finds reaches Run, which stops the daemon.
func (g *Guard) OnConnect(ctx context.Context, cn *redis.Conn) error {
	g.Check(ctx, cn)
	return nil
}

// Check reads c's settings, logs them when they change, and reports a
// Redis older than MinRedis, an evicting policy, or one Redis will not
// tell unless that is accepted. It
// returns the error it reported, if any; a Redis it could not ask
// (unreachable, a timeout) is warned about and left to the next check.
func (g *Guard) Check(ctx context.Context, c Conn) error {
	p, err := ReadPersistence(ctx, c)
	if errors.Is(err, errSentinel) {
		return nil
	}
	if verr := CheckVersion(ctx, c); verr != nil {
		g.report(verr)
		return verr
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case errors.Is(err, ErrPolicyHidden) && g.opt.SkipHidden:
		g.state = GuardSkipped
		g.warnOnce("THE EVICTION GUARD IS OFF: Redis does not tell its maxmemory-policy; redis.eviction_check: skip says it was "+
			"checked to be noeviction. Acknowledged envelopes are lost without a trace if Redis evicts", err)
		return nil
	case errors.Is(err, ErrPolicyHidden):
		err = fmt.Errorf("%w; grant the delayd user INFO, as the ACL of docs/security.md does, "+
			"or, having made sure that maxmemory-policy is noeviction, set redis.eviction_check: skip", err)
		g.report(err)
		return err
	case err != nil:
		g.warnOnce("cannot read Redis's maxmemory-policy yet; it is checked on every new connection and every "+guardEvery.String(), err)
		return nil
	}
	g.warn = ""
	if p != g.last {
		g.last = p
		g.log.Info("Redis persistence", "maxmemory-policy", p.EvictionPolicy, "appendonly", p.AppendOnly,
			"appendfsync", p.AppendFsync, "save", p.Save, "loss window on a Redis crash", p.LossWindow())
		if p.Evicts() && g.opt.AllowEviction {
			g.log.Warn("REDIS MAY EVICT KEYS: maxmemory-policy is " + p.EvictionPolicy + "; acknowledged envelopes can be lost without a trace (allowed by redis.allow_eviction)")
		}
	}
	switch {
	case !p.Evicts():
		g.state = GuardOn
	case g.opt.AllowEviction:
		g.state = GuardAllowed
	default:
		err := fmt.Errorf("store: Redis maxmemory-policy is %q: it may delete acknowledged envelopes; set maxmemory-policy noeviction (or redis.allow_eviction: true to accept the loss)", p.EvictionPolicy)
		g.report(err)
		return err
	}
	return nil
}

// report hands err to Run, which stops the daemon with it.
func (g *Guard) report(err error) {
	select {
	case g.bad <- err:
	default:
	}
}

// warnOnce logs msg unless it was the last warning logged.
func (g *Guard) warnOnce(msg string, err error) {
	if g.warn != msg {
		g.warn = msg
		g.log.Warn(msg, "error", err)
	}
}

// guardEvery is how often Run re-reads the settings: a policy changed with
// CONFIG SET on a live Redis opens no new connection.
const guardEvery = 10 * time.Second

// Run re-checks c every guardEvery until a check reports an error (an
// evicting policy, or one Redis will not tell unless that is accepted),
// and returns it.
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
