package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/bridge/delivery"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/tlsconf"
)

// NATSAuth turns the nats.* settings into connection options (for the
// daemon and for the commands that talk to it).
func NATSAuth(c config.Config) (bridge.Auth, error) {
	n := c.NATS
	a := bridge.Auth{User: n.User, Password: n.Password, Token: n.Token, NKeySeedFile: n.NKeySeedFile, CredsFile: n.CredsFile,
		InboxPrefix: n.InboxPrefix}
	var err error
	a.TLS, err = tlsClient(n.TLS)
	return a, err
}

// RedisOptions turns the redis.* settings into client options (for the
// daemon and for delayd doctor).
func RedisOptions(c config.Config) (store.Options, error) {
	r := c.Redis
	o := store.Options{Addrs: r.Addrs, Username: r.Username, Password: r.Password, DB: r.DB,
		Cluster: r.Cluster, MasterName: r.MasterName}
	if r.WaitReplicas > 0 || r.WaitLocalFsync {
		o.WaitTimeout = r.WaitTimeout
	}
	var err error
	o.TLS, err = tlsClient(r.TLS)
	return o, err
}

// tlsClient is the TLS client a tls block asks for, or nil when it asks for
// none (not enabled, no CA, no certificate).
func tlsClient(t config.TLS) (*tls.Config, error) {
	if !t.Enabled && t.CAFile == "" && t.CertFile == "" {
		return nil, nil
	}
	return tlsconf.Client(tlsconf.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile})
}

// newStore connects to Redis. It refuses to start on an evicting Redis and
// on one that cannot confirm writes as redis.wait_* asks.
func (p *parts) newStore(ctx context.Context) error {
	c := p.c
	store.SetLogger(p.log.Named("redis"))
	ropts, err := RedisOptions(c)
	if err != nil {
		return err
	}
	if !c.Embedded { // the emulation neither evicts nor persists
		p.guard = store.NewGuard(store.GuardOptions{AllowEviction: c.Redis.AllowEviction,
			SkipHidden: c.Redis.EvictionCheck == "skip"}, p.log.Named("redis"))
		p.metrics.WatchEvictionGuard(p.guard.State)
		ropts.OnConnect = p.guard.OnConnect
	}
	p.rdb = store.NewClient(ropts)
	p.id = daemonID(c.NATS.Name)
	p.st = store.New(p.rdb, c.Namespace, c.Shards, append(p.storeOptions(), store.WithMember(p.id))...)
	p.onClose(func() { p.st.Close() })
	if p.guard != nil {
		// Refuse to start on an evicting Redis, or one that will not
		// tell its policy (unless redis.eviction_check: skip). An
		// unreachable one is checked on its first connection, like
		// every reconnect.
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.guard.Check(gctx, p.rdb)
		cancel()
		if err != nil {
			return err
		}
	}
	// Refuse to start on data of a retired stored format (one key read,
	// store/schema.go). An unreachable Redis is checked once it answers
	// (waitReady); the store runs no shard script before.
	sctx, cancel := context.WithTimeout(ctx, schemaTimeout)
	err = p.st.CheckSchema(sctx)
	cancel()
	if errors.Is(err, store.ErrMigrate) {
		return err
	}
	return checkWait(ctx, c, p.st, p.log.Named("redis"))
}

// schemaTimeout bounds the start's check of the stored format: one key
// read, or without the key a scan of up to 10,000 entries, shard by shard,
// which a slow Redis link or many shards make last seconds.
const schemaTimeout = 30 * time.Second

func (p *parts) storeOptions() []store.Option {
	opts := slices.Concat(p.opt.store, []store.Option{store.WithStreamMemory(p.c.StreamDedupeWindow()),
		store.WithResendMemory(p.c.Intake.DedupeWindow), store.WithSchemaGate()})
	if r := p.c.Redis; r.WaitReplicas > 0 || r.WaitLocalFsync {
		opts = append(opts, store.WithWait(store.WaitOptions{Replicas: r.WaitReplicas, Timeout: r.WaitTimeout,
			LocalFsync: r.WaitLocalFsync, Observer: p.metrics}))
	}
	return opts
}

// checkWait refuses to start when Redis cannot confirm writes as the
// redis.wait_* settings ask (WAITAOF missing), and warns when fewer
// replicas are connected than wait_replicas. An unreachable Redis is left
// to the retries: every wait then falls short, which is safe.
func checkWait(ctx context.Context, c config.Config, st *store.Store, log hclog.Logger) error {
	r := c.Redis
	if r.WaitReplicas == 0 && !r.WaitLocalFsync {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	replicas, err := st.CheckWait(wctx)
	cancel()
	switch {
	case errors.Is(err, store.ErrWaitUnsupported):
		return err
	case err != nil:
		log.Warn("cannot check the wait settings against Redis yet", "error", err)
	case replicas < r.WaitReplicas:
		log.Warn("fewer replicas connected than redis.wait_replicas: schedules and cancels get 504 until they are back; deliveries go on",
			"connected", replicas, "wait_replicas", r.WaitReplicas)
	default:
		log.Info("writes wait for replicas", "wait_replicas", r.WaitReplicas, "wait_timeout", r.WaitTimeout,
			"wait_local_fsync", r.WaitLocalFsync, "connected", replicas)
	}
	return nil
}

// newNATS connects the request intake and the deliveries on connections of
// their own (a scanner-only daemon closes the intake's), and builds the
// publisher.
func (p *parts) newNATS() error {
	c, log := p.c, p.log.Named("nats")
	var err error
	if p.auth, err = NATSAuth(c); err != nil {
		return err
	}
	// Every connection pings at a pace derived from ownership.ttl, so a
	// silent path is noticed in seconds, not nats.go's minutes.
	if p.in, err = bridge.Connect(c.NATS.URL, c.NATS.Name+"-intake", p.auth, log, nil, nil, bridge.LivenessFor(c.Ownership.TTL)); err != nil {
		return err
	}
	p.onClose(p.in.Close)
	refusals := bridge.NewRefusals()
	live := bridge.LivenessFor(c.Ownership.TTL)
	if p.out, err = bridge.Connect(c.NATS.URL, c.NATS.Name, p.auth, log, p.metrics.NATSReconnect, refusals, live); err != nil {
		return err
	}
	p.onClose(p.out.Close)
	p.metrics.WatchNATS(p.natsUp)
	p.pub, err = delivery.NewPublisher(p.out, refusals, delivery.PublisherOptions{
		JetStream: c.Targets.JetStream, FireAndForget: c.Targets.FireAndForget, Log: p.log.Named("publish"),
		IntakeStream: c.Intake.Stream.Name,
		// A delivery's flush has half the lease from its claim; the wait
		// that follows an unconfirmed one a quarter, so the batch is given
		// back before its lease ends.
		Liveness: live, Probe: c.Scanner.Lease / 4,
		InboxProbe: bridge.InternalSubject(c.Subject) + ".probe", NoInboxCheck: c.Mode == "intake"})
	if err != nil {
		return err
	}
	p.onClose(p.pub.Close)
	return nil
}

// natsUp tells whether the connections this daemon's mode uses are up,
// the delivery path not silent.
func (p *parts) natsUp() bool {
	return p.pub.Connected() && (p.c.Mode == "scanner" || p.in.IsConnected())
}

// natsReady is natsUp with the reason when it is not.
func (p *parts) natsReady(context.Context) error {
	switch err := p.pub.Down(); {
	case err != nil:
		return err
	case p.c.Mode != "scanner" && !p.in.IsConnected():
		return errors.New("the NATS intake connection is not connected")
	}
	return nil
}
