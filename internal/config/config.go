// Package config holds delayd's one configuration struct, its defaults, the
// koanf layering (defaults → YAML file → DELAYD_* env → flags) and validation.
package config

import (
	"net"
	"strings"
	"time"

	"github.com/delayd/delayd/internal/envelope"
)

// Config is every setting of the daemon and its client commands.
type Config struct {
	// Namespace prefixes every Redis key; two deployments on one Redis
	// stay apart by using different namespaces.
	Namespace string `koanf:"namespace"`
	// Shards is fixed for the life of the data: changing it strands
	// envelopes in shards no longer scanned.
	Shards int `koanf:"shards"`
	// Subject is the NATS subject prefix of the service endpoints.
	Subject  string `koanf:"subject"`
	Embedded bool   `koanf:"embedded"`
	// Mode picks the roles of this daemon: all (intake and scanning),
	// intake (answer schedule requests only) or scanner (deliver only).
	Mode string `koanf:"mode"`
	// Ownership shares the shards among the scanning daemons.
	Ownership Ownership `koanf:"ownership"`

	NATS     NATS     `koanf:"nats"`
	Redis    Redis    `koanf:"redis"`
	Scanner  Scanner  `koanf:"scanner"`
	Intake   Intake   `koanf:"intake"`
	Limits   Limits   `koanf:"limits"`
	Targets  Targets  `koanf:"targets"`
	Dead     Dead     `koanf:"dead"`
	Log      Log      `koanf:"log"`
	Shutdown Shutdown `koanf:"shutdown"`
	HTTP     HTTP     `koanf:"http"`
	UI       UI       `koanf:"ui"`
	Headers  Headers  `koanf:"headers"`
}

// UI is the web console and its API at /ui, on a listener of its own so
// that it can stay on loopback while probes and metrics face the network.
type UI struct {
	Enabled bool `koanf:"enabled"`
	// Addr is host:port of the console; loopback by default, reachable
	// through kubectl port-forward or an SSH tunnel. Empty turns it off.
	Addr string `koanf:"addr"`
	// Insecure allows a non-loopback Addr without authentication.
	Insecure bool `koanf:"insecure"`
	// ShowPayloads shows payloads and header values; off, the console shows
	// sizes and header names only.
	ShowPayloads bool `koanf:"show_payloads"`
	// RedactHeaders are headers whose values are never shown, in the
	// console, by delayd get or in logs, even with ShowPayloads.
	RedactHeaders []string `koanf:"redact_headers"`
	// AllowActions enables cancel, replay, purge, limits and pauses;
	// read-only otherwise.
	AllowActions      bool   `koanf:"allow_actions"`
	BasicAuthUser     string `koanf:"basic_auth_user"`
	BasicAuthPassword string `koanf:"basic_auth_password"`
	BearerToken       string `koanf:"bearer_token"`
}

// Headers is the policy on the headers publishers send.
type Headers struct {
	// AllowNATS lists Nats-* headers a publisher may pass through to the
	// target on purpose; every other Nats-* header is refused with 400.
	AllowNATS []string `koanf:"allow_nats"`
}

// HTTP is the probe and metrics server: /livez, /readyz, /metrics.
type HTTP struct {
	// Addr is host:port to listen on; empty turns the server off.
	Addr string `koanf:"addr"`
	// SampleInterval is how often the Redis-backed gauges are refreshed.
	SampleInterval time.Duration `koanf:"sample_interval"`
}

// NATS is the connection delayd takes intake from and delivers through.
// At most one of user/password, token, nkey seed and creds file is used.
type NATS struct {
	URL          string `koanf:"url"`
	Name         string `koanf:"name"`
	User         string `koanf:"user"`
	Password     string `koanf:"password"`
	Token        string `koanf:"token"`
	NKeySeedFile string `koanf:"nkey_seed_file"`
	CredsFile    string `koanf:"creds_file"`
	TLS          TLS    `koanf:"tls"`
	// InboxPrefix replaces "_INBOX" in this process's reply subjects, so
	// its NATS user may subscribe to its own replies only (one prefix per
	// user: see the permission blocks of docs/security.md).
	InboxPrefix string `koanf:"inbox_prefix"`
}

// TLS configures a TLS client. With a CA file the server certificate is
// verified against it; with a cert and key the client presents them.
type TLS struct {
	Enabled  bool   `koanf:"enabled"`
	CAFile   string `koanf:"ca_file"`
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Ownership tunes the shard leases.
type Ownership struct {
	// TTL of a shard lease: a dead daemon's shards pass to the others
	// within about this long; leases are renewed every TTL/3.
	TTL time.Duration `koanf:"ttl"`
}

// Redis is where envelopes are kept.
type Redis struct {
	// Addrs are host:port; a rediss:// prefix turns TLS on. Several
	// addresses select Redis Cluster (or, with MasterName, Sentinels).
	Addrs []string `koanf:"addrs"`
	// Cluster forces the Cluster client with a single address.
	Cluster bool `koanf:"cluster"`
	// MasterName selects Sentinel: Addrs are the sentinels.
	MasterName string `koanf:"master_name"`
	Username   string `koanf:"username"`
	Password   string `koanf:"password"`
	DB         int    `koanf:"db"`
	TLS        TLS    `koanf:"tls"`
	// AllowEviction lets delayd run on a Redis whose maxmemory-policy may
	// delete keys, which loses acknowledged envelopes. Off, delayd refuses.
	AllowEviction bool `koanf:"allow_eviction"`
	// EvictionCheck is required (delayd refuses to run on a Redis that
	// will not tell its maxmemory-policy) or skip (the operator checked
	// the policy; delayd still refuses an evicting one it can read).
	EvictionCheck string `koanf:"eviction_check"`
	// WaitReplicas > 0: a schedule or cancel is answered, a stream message
	// acknowledged and a claim published only once WAIT confirmed that
	// this many replicas hold it; otherwise the request gets 504 (the
	// stream message comes again), and a claim is published anyway,
	// counted and warned about (WaitClaims: deliver). 0 waits for none
	// (asynchronous replication).
	WaitReplicas int `koanf:"wait_replicas"`
	// WaitClaims is what happens to a claim whose wait falls short:
	// deliver (published anyway, counted, warned) or strict (not
	// published, given back uncounted: deliveries pause while no replica
	// confirms, and no failover can repeat an attempt number).
	WaitClaims string `koanf:"wait_claims"`
	// WaitTimeout bounds each wait.
	WaitTimeout time.Duration `koanf:"wait_timeout"`
	// WaitLocalFsync also waits for the master's AOF fsync (WAITAOF, Redis
	// 7.2 or newer with appendonly yes; delayd refuses to start otherwise).
	WaitLocalFsync bool `koanf:"wait_local_fsync"`
}

// Scanner tunes the clock that claims and delivers due envelopes.
type Scanner struct {
	ClaimBatch int `koanf:"claim_batch"`
	// ClaimBytes bounds the stored bytes one claim takes, so large
	// payloads cannot pull more into memory than the limit holds; four
	// claims' worth at most is held between claim and publish (the 1 KiB
	// each envelope counts besides its bytes, until its ack). 0 derives
	// it: 4 MiB without a Go memory limit, or a sixteenth of the limit
	// when one is set, at most 8 MiB.
	ClaimBytes int64 `koanf:"claim_bytes"`
	// Lease is how long a claimed envelope may stay unacknowledged before
	// another scan delivers it again (at-least-once after a crash).
	Lease time.Duration `koanf:"lease"`
	// IdleInterval caps how long a shard sleeps when nothing is due, so
	// envelopes written by other daemons are found without a wake-up.
	IdleInterval time.Duration `koanf:"idle_interval"`
	// RetryBackoff delays the next try after a failed publish, doubled per
	// try of the envelope up to RetryBackoffMax (0, or less than
	// RetryBackoff: a constant RetryBackoff).
	RetryBackoff    time.Duration `koanf:"retry_backoff"`
	RetryBackoffMax time.Duration `koanf:"retry_backoff_max"`
	// MaxAttempts moves an envelope to the dead set after this many
	// deliveries without an ack.
	MaxAttempts int `koanf:"max_attempts"`
	// NoInterestRetryFor is how long a core delivery that reaches no
	// subscriber keeps being retried, by the backoff schedule, before the
	// dead set, when that is longer than MaxAttempts tries take; 0 holds
	// it to MaxAttempts like any failure.
	NoInterestRetryFor time.Duration `koanf:"no_interest_retry_for"`
	// CheckInterval: every interval one owned shard is checked, slowly
	// and read-only, for data that breaks the store's invariants (what
	// delayd doctor checks). 0 turns the background check off.
	CheckInterval time.Duration `koanf:"check_interval"`
}

// Intake tunes how schedule requests are batched into Redis pipelines.
// Batches grow while the pipelines in flight are busy, up to Batch; Linger
// additionally waits for more requests when a pipeline is free (0: never).
type Intake struct {
	Batch  int           `koanf:"batch"`
	Linger time.Duration `koanf:"linger"`
	// MaxBatch bounds the envelopes of one batch request (Delayd-Batch),
	// on both intakes: a larger batch is refused whole (413).
	MaxBatch int `koanf:"max_batch"`
	// PendingBytes bounds the bytes of schedule requests taken and not yet
	// answered, and again those the NATS client buffers for the handler
	// (beyond which it drops requests: their publishers time out and
	// retry). 0 derives it: 32 MiB, or a sixteenth of the Go memory limit.
	PendingBytes int64 `koanf:"pending_bytes"`
	// DedupeWindow is how long after its due time a delivered envelope
	// with a publisher's Delayd-Id is remembered: a resend of the same
	// request (a client retrying after a 504 or a timeout) is answered
	// with the due time it had instead of scheduled again. 0 turns it off.
	DedupeWindow time.Duration `koanf:"dedupe_window"`
	// Stream is the durable intake: a JetStream stream that holds
	// envelopes published to <subject>.intake while no delayd runs.
	Stream Stream `koanf:"stream"`
}

// Stream configures the JetStream intake stream and its shared consumer.
type Stream struct {
	// Enabled is auto (on when the server has JetStream, a warning when it
	// has not), true (required: delayd stops when it cannot set it up) or
	// false.
	Enabled string `koanf:"enabled"`
	// Name of the stream, and of the durable pull consumer all daemons
	// share. Created when missing (with the settings below), bound as it
	// is when it exists.
	Name string `koanf:"name"`
	// Replicas of a created stream (1 on a single server, 3 or 5 in a
	// cluster).
	Replicas int `koanf:"replicas"`
	// Retention of a created stream: "limits" (acks delete nothing; the
	// daemons purge whole ranges below the consumer's ack floor) or
	// "workqueue" (each ack deletes its message, the layout before 0.2.0:
	// slower, but needs no purge permission). A stream that exists is
	// bound as it is.
	Retention string `koanf:"retention"`
	// MaxAge and MaxBytes bound a created stream; 0 = unlimited. A limit
	// discards envelopes no delayd has taken yet: leave them at 0 unless
	// the stream must not grow without bound while delayd is away.
	MaxAge   time.Duration `koanf:"max_age"`
	MaxBytes int64         `koanf:"max_bytes"`
	// Pull is how many messages a daemon keeps requested from the stream.
	Pull int `koanf:"pull"`
	// PullBytes bounds the bytes of stream messages the NATS client
	// buffers for a daemon, and again those it holds taken and not yet
	// acknowledged, so a burst of large envelopes waits in the stream
	// instead of in memory. Never below the NATS server's max_payload (plus
	// headers): a bound below the stream's head message would stall the
	// consumer. 0 derives it
	// like intake.pending_bytes: 32 MiB, or a sixteenth of the Go memory
	// limit.
	PullBytes int64 `koanf:"pull_bytes"`
	// AckWait: a message taken and not acknowledged within it (its daemon
	// died) is delivered again, to any daemon.
	AckWait time.Duration `koanf:"ack_wait"`
	// RetryDelay is how long a message waits in the stream before it is
	// offered again after Redis failed to store it.
	RetryDelay time.Duration `koanf:"retry_delay"`
	// DedupeWindow is how long delayd remembers each stream message it
	// stored, so a redelivery after a lost ack (a daemon killed between
	// the Redis write and the ack, a stream leader change) is acked and
	// not stored again. It must outlast the redeliveries: ack_wait times
	// the lost acks in a row it covers.
	// 0 derives it: 5m, or twice ack_wait when that is longer.
	DedupeWindow time.Duration `koanf:"dedupe_window"`
}

// Limits bound one schedule request.
type Limits struct {
	// MaxPayload bounds the payload; 0 follows the NATS server's
	// max_payload. Either way the whole delivered message (payload and
	// the headers delayd adds) must fit the server's max_payload.
	MaxPayload     int           `koanf:"max_payload"`
	MaxIDLen       int           `koanf:"max_id_len"`
	MaxHeaders     int           `koanf:"max_headers"`
	MaxHeaderBytes int           `koanf:"max_header_bytes"`
	MaxDelay       time.Duration `koanf:"max_delay"`
	MaxPast        time.Duration `koanf:"max_past"`
	MaxJitter      time.Duration `koanf:"max_jitter"`
}

// Targets is the policy on which subjects delayd may deliver to, and how.
type Targets struct {
	Allow []string `koanf:"allow"`
	// Deny is added to the built-in deny list, never replaces it.
	Deny []string `koanf:"deny"`
	// JetStream lists patterns of targets published with the JetStream API
	// (PubAck required, Nats-Msg-Id set for deduplication).
	JetStream []string `koanf:"jetstream"`
	// FireAndForget lists patterns of core targets published without the
	// interest check: a delivery that reaches no subscriber counts as
	// delivered instead of being retried.
	FireAndForget []string `koanf:"fire_and_forget"`
	// Limits are rate limits on target patterns, "PATTERN RATE [BURST]"
	// ("orders.> 500/s 50"), written to Redis at every start: the fleet
	// obeys them as if set with `delayd limit` (flow.ParseLimit).
	Limits []string `koanf:"limits"`
}

// Dead configures what happens to envelopes that cannot be delivered.
type Dead struct {
	// Publish also sends each dead envelope to <subject>.dead.<target>.
	Publish bool `koanf:"publish"`
}

// Log configures the root hclog logger.
type Log struct {
	Level string `koanf:"level"`
	JSON  bool   `koanf:"json"`
}

// Shutdown bounds graceful shutdown.
type Shutdown struct {
	Timeout time.Duration `koanf:"timeout"`
}

// Default returns the configuration used where nothing else is set.
func Default() Config {
	return Config{
		Namespace: "delayd",
		Shards:    16,
		Subject:   "delayd",
		Mode:      "all",
		Ownership: Ownership{TTL: 5 * time.Second},
		NATS:      NATS{URL: "nats://127.0.0.1:4222", Name: "delayd", InboxPrefix: "_INBOX"},
		Redis:     Redis{Addrs: []string{"127.0.0.1:6379"}, WaitTimeout: time.Second, WaitClaims: "deliver", EvictionCheck: "required"},
		Scanner: Scanner{
			ClaimBatch:      256,
			Lease:           10 * time.Second,
			IdleInterval:    time.Second,
			RetryBackoff:    time.Second,
			RetryBackoffMax: time.Minute,
			MaxAttempts:     10,
			// With the backoff above: 16 tries, the last 10m3s after the
			// first, where 10 attempts end after 4m3s.
			NoInterestRetryFor: 10 * time.Minute,
			// A shard every minute: 16 shards are all checked in 16 min.
			CheckInterval: time.Minute,
		},
		Intake: Intake{Batch: 256, MaxBatch: 1000, DedupeWindow: time.Minute, Stream: Stream{Enabled: "auto", Name: "DELAYD_INTAKE", Retention: "limits", Replicas: 1,
			Pull: 1024, AckWait: 30 * time.Second, RetryDelay: time.Second}},
		Limits: Limits{
			MaxPayload:     0, // the NATS server's max_payload
			MaxIDLen:       256,
			MaxHeaders:     64,
			MaxHeaderBytes: 16 << 10,
			MaxDelay:       366 * 24 * time.Hour,
			MaxPast:        24 * time.Hour,
			MaxJitter:      time.Hour,
		},
		Log:  Log{Level: "info"},
		HTTP: HTTP{Addr: ":9479", SampleInterval: 5 * time.Second},
		UI: UI{Enabled: true, Addr: "127.0.0.1:9480",
			RedactHeaders: []string{"Authorization", "Cookie", "Set-Cookie", "Proxy-Authorization", "X-Api-Key"}},
		Shutdown: Shutdown{Timeout: 10 * time.Second},
	}
}

// StreamDedupeWindow is intake.stream.dedupe_window, derived when 0: 5m,
// or twice ack_wait when that is longer.
func (c Config) StreamDedupeWindow() time.Duration {
	if w := c.Intake.Stream.DedupeWindow; w > 0 {
		return w
	}
	return max(5*time.Minute, 2*c.Intake.Stream.AckWait)
}

// StreamEnabled reports whether the stream intake may run (auto or true).
func (c Config) StreamEnabled() bool { return c.Intake.Stream.Enabled != "false" }

// EnvelopeLimits converts the limits for the envelope parser.
func (c Config) EnvelopeLimits() envelope.Limits {
	l := c.Limits
	return envelope.Limits{
		MaxPayload: l.MaxPayload, MaxIDLen: l.MaxIDLen, MaxHeaders: l.MaxHeaders,
		MaxHeaderBytes: l.MaxHeaderBytes, MaxDelay: l.MaxDelay, MaxPast: l.MaxPast,
		MaxJitter: l.MaxJitter,
	}
}

// Policy returns what delayd may do for a publisher: the target lists (on
// top of the built-in deny list, which cannot be switched off) and the
// Nats-* headers allowed through.
func (c Config) Policy() envelope.Policy {
	return envelope.Policy{Prefix: c.Subject, Allow: c.Targets.Allow, Deny: c.Targets.Deny, AllowNATS: c.Headers.AllowNATS}
}

// Loopback reports whether the host of addr (host:port) can only be reached
// from this machine: a loopback IP or "localhost". An empty host listens on
// every interface; a host name is assumed to be reachable.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Redacted returns a copy safe to log or print: passwords and tokens
// replaced, and credentials in URLs hidden.
func (c Config) Redacted() Config {
	for _, p := range c.secrets() {
		if *p != "" {
			*p = redacted
		}
	}
	c.NATS.URL = RedactURL(c.NATS.URL)
	addrs := make([]string, len(c.Redis.Addrs))
	for i, a := range c.Redis.Addrs {
		addrs[i] = RedactURL(a)
	}
	c.Redis.Addrs = addrs
	return c
}

const redacted = "REDACTED"

// RedactURL hides the user info of URLs (comma-separated lists too):
// nats://u:p@h:4222 becomes nats://REDACTED@h:4222, and u:p@h:4222 (NATS
// and go-redis take addresses without a scheme) REDACTED@h:4222.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if ok {
			scheme += "://"
		} else {
			scheme, rest = "", p
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			parts[i] = scheme + redacted + rest[at:]
		}
	}
	return strings.Join(parts, ",")
}

// SecretKeys are the keys whose values are credentials: Redacted hides
// them, and no error ever quotes their values, whatever their type.
var SecretKeys = []string{"nats.password", "nats.token", "redis.password", "ui.basic_auth_password", "ui.bearer_token"}

// secrets are the fields of SecretKeys, by key.
func (c *Config) secrets() map[string]*string {
	return map[string]*string{"nats.password": &c.NATS.Password, "nats.token": &c.NATS.Token,
		"redis.password": &c.Redis.Password, "ui.basic_auth_password": &c.UI.BasicAuthPassword,
		"ui.bearer_token": &c.UI.BearerToken}
}

// redactedCreds reports whether the credentials of a URL (or of a
// user@host:port address) are the mark RedactURL puts there.
func redactedCreds(s string) bool {
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	}
	at := strings.LastIndex(s, "@")
	return at >= 0 && s[:at] == redacted
}
