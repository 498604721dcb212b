package store

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Options selects the Redis deployment.
type Options struct {
	// Addrs are host:port, or rediss://host:port for TLS.
	Addrs    []string
	Username string
	Password string
	DB       int
	// TLS, if not nil, is used for every connection (CA, client cert).
	// A rediss:// address turns TLS on with the system roots if it is nil.
	TLS *tls.Config
	// Cluster forces Redis Cluster with one address (several imply it).
	Cluster bool
	// MasterName selects Sentinel; Addrs are then the sentinels.
	MasterName string
	// OnConnect, if set, runs on every new connection (to every node):
	// delayd checks there that Redis does not evict keys.
	OnConnect func(ctx context.Context, cn *redis.Conn) error
	// WaitTimeout is redis.wait_timeout when writes wait for replicas: a
	// pipeline's reply then takes that much longer (WithWait).
	WaitTimeout time.Duration
}

// NewClient builds a go-redis client for the options. A single address
// gives a plain client; several give a Cluster client.
func NewClient(o Options) redis.UniversalClient {
	addrs := make([]string, len(o.Addrs))
	for i, a := range o.Addrs {
		lower := strings.ToLower(a)
		if !strings.HasPrefix(lower, "redis://") && !strings.HasPrefix(lower, "rediss://") {
			addrs[i] = a
			continue
		}
		// A URL: its credentials and database go to the options, so the
		// address that reaches dial errors, logs and /readyz holds none.
		u, err := url.Parse(a)
		if err != nil {
			addrs[i] = redactAddr(a)
			continue
		}
		if strings.EqualFold(u.Scheme, "rediss") && o.TLS == nil {
			o.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if u.User != nil && o.Username == "" && o.Password == "" {
			o.Username = u.User.Username()
			o.Password, _ = u.User.Password()
		}
		if db, err := strconv.Atoi(strings.TrimPrefix(u.Path, "/")); err == nil && o.DB == 0 {
			o.DB = db
		}
		addrs[i] = u.Host
		if u.Port() == "" {
			addrs[i] = net.JoinHostPort(u.Hostname(), "6379")
		}
	}
	if o.TLS != nil && o.TLS.ServerName == "" && len(addrs) > 0 {
		// Verify the certificate against the host we dial.
		o.TLS = o.TLS.Clone()
		o.TLS.ServerName = addrs[0]
		if host, _, err := net.SplitHostPort(addrs[0]); err == nil {
			o.TLS.ServerName = host
		}
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:     addrs,
		Username:  o.Username,
		Password:  o.Password,
		DB:        o.DB,
		TLSConfig: o.TLS,
		// go-redis follows MOVED and ASK and retries TRYAGAIN and
		// CLUSTERDOWN within these redirects.
		MaxRedirects:  3,
		IsClusterMode: o.Cluster,
		MasterName:    o.MasterName,
		// Fail fast and let the callers back off: the intake answers 503
		// and the scanner retries, neither should hang on a dead Redis.
		DialTimeout: 2 * time.Second,
		// One dial per call: go-redis would otherwise retry a refused
		// dial five times with backoff, holding a whole pipeline (every
		// shard) for seconds while one Cluster master is down. The store's
		// callers retry with their own backoff.
		DialerRetries:      1,
		DialerRetryTimeout: 10 * time.Millisecond,
		ReadTimeout:        3*time.Second + o.WaitTimeout,
		WriteTimeout:       3 * time.Second,
		// No silent retries: a retry after a timeout would hide that the
		// first try may have written, and the intake must know whether
		// "nothing stored" is true. The callers retry.
		MaxRetries: -1,
		OnConnect:  o.OnConnect,
	})
}

// redactAddr drops anything before an "@" of an address that would not
// parse, so a password in it never reaches a log.
func redactAddr(a string) string {
	if i := strings.LastIndex(a, "@"); i >= 0 {
		return "REDACTED@" + a[i+1:]
	}
	return a
}

// failed reacts to a failed call. Under Cluster, go-redis refreshes its
// slot map on MOVED/ASK, or once a minute: a master that died (connection
// refused) while its replica took over would otherwise be dialled for up to
// a minute. So a failure asks for a fresh map, at most twice a second.
func (s *Store) failed(err error) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastReload.Load()
	if now-last < int64(500*time.Millisecond) || !s.lastReload.CompareAndSwap(last, now) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cc.ReloadState(ctx)
	}()
}

// SetLogger routes go-redis' own log lines (dial failures and the like) to
// log at debug level: the store's callers already log what those failures
// mean, once, with backoff. go-redis only offers a process-wide logger.
func SetLogger(log hclog.Logger) {
	redis.SetLogger(redisLogger{log})
}

type redisLogger struct{ log hclog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}
