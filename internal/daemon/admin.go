package daemon

import (
	"context"
	"fmt"
	"strings"

	"github.com/delayd/delayd/internal/admin"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
)

// servers are the admin server and the console, each if its address is
// set. Both listen now, so a port conflict fails the start.
func (p *parts) servers() ([]component, error) {
	var comps []component
	if p.c.HTTP.Addr != "" {
		srv, err := p.newAdmin()
		if err != nil {
			return nil, err
		}
		comps = append(comps, component{"admin", srv.Run})
	}
	if p.c.UI.Enabled && p.c.UI.Addr != "" {
		srv, err := p.newConsole()
		if err != nil {
			return nil, err
		}
		comps = append(comps, component{"console", srv.Run})
	}
	return comps, nil
}

// newAdmin listens on http.addr for /livez, /readyz and /metrics. Ready
// means the NATS connections of the mode up, Redis answering and, for a
// scanning daemon, its delivery inbox proven and shard ownership working
// (Ownership.Ready).
func (p *parts) newAdmin() (*admin.Server, error) {
	checks := []admin.Check{
		{Name: "nats", Fn: p.natsReady},
		{Name: "redis", Fn: p.st.Ready},
	}
	if p.c.Mode != "intake" {
		checks = append(checks, admin.Check{Name: "shards", Fn: p.own.Ready})
	}
	srv, err := admin.Listen(p.c.HTTP.Addr, p.metrics, checks, p.log.Named("admin"))
	if err != nil {
		return nil, listenErr("http.addr", p.c.HTTP.Addr, err)
	}
	return srv, nil
}

// listenErr names the config key of an address delayd could not listen
// on, so that a taken port says what to change.
func listenErr(key, addr string, err error) error {
	return fmt.Errorf("%s %s: %w (set another with --set %s=HOST:PORT or %s)", key, addr, err, key,
		"DELAYD_"+strings.ToUpper(strings.ReplaceAll(key, ".", "_")))
}

// newConsole listens on ui.addr for the console, warning when that is
// reachable from the network.
func (p *parts) newConsole() (*admin.Server, error) {
	u := p.c.UI
	ui := admin.NewUI(p.insp, p.metrics, admin.UIOptions{
		AllowActions: u.AllowActions, ShowPayloads: u.ShowPayloads, RedactHeaders: u.RedactHeaders,
		BasicUser: u.BasicAuthUser, BasicPass: u.BasicAuthPassword, BearerToken: u.BearerToken,
		Policy: p.c.Policy(), JetStream: p.c.Targets.JetStream, Flow: p.flow,
	}, p.log.Named("ui"))
	srv, err := admin.ListenUI(u.Addr, ui, p.log.Named("ui"))
	if err != nil {
		return nil, listenErr("ui.addr", u.Addr, err)
	}
	if !config.Loopback(u.Addr) {
		p.log.Warn("the console is reachable from the network", "addr", u.Addr,
			"auth", u.BasicAuthUser != "" || u.BearerToken != "", "insecure", u.Insecure)
	}
	return srv, nil
}

// inspector is the store as the operator endpoints (NATS and the console)
// see it: a replay also wakes the scanner of the replayed envelopes'
// shards, so they go out now rather than at the next idle tick; replays
// and purges are counted, so the dead-set counters agree with the set.
type inspector struct {
	*store.Store
	wake func(shard int, dueMs int64)
	obs  *admin.Metrics
}

func (i inspector) Purge(ctx context.Context, ids []string) (int, error) {
	n, err := i.Store.Purge(ctx, ids)
	i.obs.Purged(n)
	return n, err
}

func (i inspector) Replay(ctx context.Context, ids []string) (int, error) {
	n, err := i.Store.Replay(ctx, ids)
	if n > 0 {
		i.obs.Redelivered("replay", n)
		woken := map[int]bool{}
		for _, id := range ids {
			if sh := i.Shard(id); !woken[sh] {
				woken[sh] = true
				i.wake(sh, 0)
			}
		}
	}
	return n, err
}
