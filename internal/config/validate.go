package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
)

// Validate returns every problem in c, each prefixed with its key.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	positive := func(key string, v int64) {
		if v <= 0 {
			bad(key, "must be positive, got %d", v)
		}
	}
	if c.Namespace == "" || strings.ContainsAny(c.Namespace, "{}") {
		bad("namespace", "must be non-empty and contain no braces, got %q", c.Namespace)
	}
	switch c.Mode {
	case "all", "intake", "scanner":
	default:
		bad("mode", "must be all, intake or scanner, got %q", c.Mode)
	}
	if c.Ownership.TTL < 300*time.Millisecond {
		bad("ownership.ttl", "must be at least 300ms, got %s", c.Ownership.TTL)
	}
	if c.Redis.Cluster && c.Redis.MasterName != "" {
		bad("redis", "cluster and master_name exclude each other")
	}
	c.validateWait(bad)
	switch c.Redis.EvictionCheck {
	case "required", "skip":
	default:
		bad("redis.eviction_check", "must be required or skip, got %q", c.Redis.EvictionCheck)
	}
	if c.Shards < 1 || c.Shards > 16384 {
		bad("shards", "must be 1..16384, got %d", c.Shards)
	}
	if !envelope.ValidTarget(c.Subject) {
		bad("subject", "must be a literal NATS subject, got %q", c.Subject)
	}
	if c.NATS.URL == "" {
		bad("nats.url", "must be set")
	}
	for _, u := range strings.Split(c.NATS.URL, ",") {
		if err := checkNATSURL(u); err != nil {
			bad("nats.url", "%s: %v", RedactURL(strings.TrimSpace(u)), err)
		}
	}
	c.validateNotRedacted(bad)
	auth := 0
	for _, set := range []bool{c.NATS.User != "" || c.NATS.Password != "", c.NATS.Token != "", c.NATS.NKeySeedFile != "", c.NATS.CredsFile != ""} {
		if set {
			auth++
		}
	}
	if auth > 1 {
		bad("nats", "set at most one of user/password, token, nkey_seed_file and creds_file")
	}
	if !envelope.ValidTarget(c.NATS.InboxPrefix) || !envelope.HasPrefixFold(c.NATS.InboxPrefix, "_INBOX") {
		// Starting with _INBOX keeps it under the built-in target deny.
		bad("nats.inbox_prefix", "must be a literal subject starting with _INBOX, such as _INBOX or _INBOX_ops, got %q", c.NATS.InboxPrefix)
	}
	for key, t := range map[string]TLS{"nats.tls": c.NATS.TLS, "redis.tls": c.Redis.TLS} {
		if (t.CertFile == "") != (t.KeyFile == "") {
			bad(key, "cert_file and key_file go together")
		}
	}
	if len(c.Redis.Addrs) == 0 && !c.Embedded {
		bad("redis.addrs", "must list at least one host:port")
	}
	for _, a := range c.Redis.Addrs {
		if !strings.Contains(a, ":") {
			bad("redis.addrs", "%q is not host:port", a)
		}
	}
	if c.Scanner.ClaimBytes < 0 {
		bad("scanner.claim_bytes", "must be 0 (derived from the memory limit) or positive, got %d", c.Scanner.ClaimBytes)
	}
	if c.Scanner.ClaimBatch < 1 || c.Scanner.ClaimBatch > 4096 {
		bad("scanner.claim_batch", "must be 1..4096, got %d", c.Scanner.ClaimBatch)
	}
	if c.Scanner.Lease < 200*time.Millisecond {
		// A publish gets half the lease; less than 100 ms leaves no room.
		bad("scanner.lease", "must be at least 200ms, got %s", c.Scanner.Lease)
	}
	positive("scanner.idle_interval", int64(c.Scanner.IdleInterval))
	positive("scanner.retry_backoff", int64(c.Scanner.RetryBackoff))
	positive("scanner.max_attempts", int64(c.Scanner.MaxAttempts))
	if c.Scanner.RetryBackoffMax < 0 {
		bad("scanner.retry_backoff_max", "must not be negative (0 keeps scanner.retry_backoff constant), got %s", c.Scanner.RetryBackoffMax)
	}
	if c.Scanner.NoInterestRetryFor < 0 {
		bad("scanner.no_interest_retry_for", "must not be negative (0: scanner.max_attempts, as for any failure), got %s", c.Scanner.NoInterestRetryFor)
	}
	if c.Scanner.CheckInterval != 0 && c.Scanner.CheckInterval < time.Second {
		bad("scanner.check_interval", "must be 0 (off) or at least 1s, got %s", c.Scanner.CheckInterval)
	}
	positive("intake.batch", int64(c.Intake.Batch))
	if c.Intake.MaxBatch < 1 || c.Intake.MaxBatch > 100000 {
		bad("intake.max_batch", "must be 1..100000, got %d", c.Intake.MaxBatch)
	}
	if w := c.Intake.DedupeWindow; w != 0 && (w < time.Second || w > 24*time.Hour) {
		bad("intake.dedupe_window", "must be 0 (off) or from 1s to 24h, got %s", w)
	}
	if c.Intake.PendingBytes < 0 {
		bad("intake.pending_bytes", "must be 0 (derived from the memory limit) or positive, got %d", c.Intake.PendingBytes)
	}
	if c.Intake.Linger < 0 {
		bad("intake.linger", "must not be negative, got %s", c.Intake.Linger)
	}
	c.validateStream(bad)
	if c.Limits.MaxPayload < 0 {
		bad("limits.max_payload", "must be 0 (the NATS server's max_payload) or positive, got %d", c.Limits.MaxPayload)
	}
	positive("limits.max_headers", int64(c.Limits.MaxHeaders))
	positive("limits.max_header_bytes", int64(c.Limits.MaxHeaderBytes))
	positive("limits.max_delay", int64(c.Limits.MaxDelay))
	positive("shutdown.timeout", int64(c.Shutdown.Timeout))
	positive("http.sample_interval", int64(c.HTTP.SampleInterval))
	if (c.UI.BasicAuthUser == "") != (c.UI.BasicAuthPassword == "") {
		bad("ui", "basic_auth_user and basic_auth_password go together")
	}
	if c.HTTP.Addr != "" && !strings.Contains(c.HTTP.Addr, ":") {
		bad("http.addr", "must be host:port or :port, got %q", c.HTTP.Addr)
	}
	if c.UI.Enabled && c.UI.Addr != "" {
		switch {
		case !strings.Contains(c.UI.Addr, ":"):
			bad("ui.addr", "must be host:port or :port, got %q", c.UI.Addr)
		case !Loopback(c.UI.Addr) && c.UI.BasicAuthUser == "" && c.UI.BearerToken == "" && !c.UI.Insecure:
			bad("ui.addr", "%q is reachable from the network and the console has no authentication: "+
				"set ui.basic_auth_user/ui.basic_auth_password or ui.bearer_token, keep ui.addr on loopback, "+
				"or set ui.insecure: true to expose it anyway", c.UI.Addr)
		}
	}
	for _, h := range c.Headers.AllowNATS {
		if len(h) <= len("Nats-") || !strings.EqualFold(h[:len("Nats-")], "Nats-") {
			bad("headers.allow_nats", "%q is not a Nats-* header", h)
		}
	}
	if c.Limits.MaxIDLen < 1 || c.Limits.MaxIDLen > 256 {
		bad("limits.max_id_len", "must be 1..256, got %d", c.Limits.MaxIDLen)
	}
	if c.Limits.MaxPast < 0 || c.Limits.MaxPast > envelope.MaxDelayLimit {
		bad("limits.max_past", "must be 0 (no limit) up to %s, got %s", envelope.MaxDelayLimit, c.Limits.MaxPast)
	}
	if c.Limits.MaxDelay > envelope.MaxDelayLimit {
		bad("limits.max_delay", "must be at most %s (100 years), got %s", envelope.MaxDelayLimit, c.Limits.MaxDelay)
	}
	if c.Limits.MaxJitter <= 0 || c.Limits.MaxJitter > envelope.MaxDelayLimit {
		bad("limits.max_jitter", "must be positive, at most %s (100 years), got %s", envelope.MaxDelayLimit, c.Limits.MaxJitter)
	}
	for _, key := range []struct {
		name string
		pats []string
	}{{"targets.allow", c.Targets.Allow}, {"targets.deny", c.Targets.Deny}, {"targets.jetstream", c.Targets.JetStream},
		{"targets.fire_and_forget", c.Targets.FireAndForget}} {
		for _, p := range key.pats {
			if !envelope.ValidPattern(p) {
				bad(key.name, "%q is not a subject pattern", p)
			}
		}
	}
	for _, l := range c.Targets.Limits {
		if _, _, _, err := flow.ParseLimit(l); err != nil {
			bad("targets.limits", "%v", err)
		}
	}
	if hclog.LevelFromString(c.Log.Level) == hclog.NoLevel {
		bad("log.level", "must be one of trace, debug, info, warn, error, got %q", c.Log.Level)
	}
	return errors.Join(errs...)
}

// validateWait checks the redis.wait_* settings.
func (c Config) validateWait(bad func(key, format string, args ...any)) {
	r := c.Redis
	if r.WaitReplicas < 0 || r.WaitReplicas > 16 {
		bad("redis.wait_replicas", "must be 0 (no wait) up to 16, got %d", r.WaitReplicas)
	}
	switch r.WaitClaims {
	case "deliver":
	case "strict":
		if r.WaitReplicas == 0 && !r.WaitLocalFsync {
			bad("redis.wait_claims", "strict needs a wait to fall short: set redis.wait_replicas (or wait_local_fsync)")
		}
	default:
		bad("redis.wait_claims", "must be deliver or strict, got %q", r.WaitClaims)
	}
	if r.WaitReplicas == 0 && !r.WaitLocalFsync {
		return
	}
	if c.Embedded {
		bad("redis", "wait_replicas and wait_local_fsync need a real Redis; the embedded emulation has no replicas and no AOF")
	}
	// A claim waits before it publishes, and a publish must end within
	// half the lease: a wait of a quarter leaves the other quarter.
	if r.WaitTimeout < time.Millisecond || r.WaitTimeout > 4*time.Second || r.WaitTimeout > c.Scanner.Lease/4 {
		bad("redis.wait_timeout", "must be 1ms..4s and at most a quarter of scanner.lease (%s), got %s", c.Scanner.Lease, r.WaitTimeout)
	}
}

// maxStreamName is the longest intake.stream.name: 255 (JetStream's
// longest name) less len("_MIGRATING").
const maxStreamName = 255 - len("_MIGRATING")

func (c Config) validateStream(bad func(key, format string, args ...any)) {
	s := c.Intake.Stream
	switch s.Enabled {
	case "auto", "true", "false":
	default:
		bad("intake.stream.enabled", "must be auto, true or false, got %q", s.Enabled)
	}
	if s.Name == "" || strings.ContainsAny(s.Name, ".*> \t/\\") {
		bad("intake.stream.name", "must be a non-empty JetStream name without '.', '*', '>', '/', '\\' or spaces, got %q", s.Name)
	}
	// The migration to the limits layout creates <name>_MIGRATING, and a
	// JetStream name has 255 characters at most.
	if len(s.Name) > maxStreamName {
		bad("intake.stream.name", "must be %d characters at most (%s_MIGRATING, which delayd intake migrate creates, fits JetStream's 255), got %d",
			maxStreamName, "<name>", len(s.Name))
	}
	if s.Retention != "limits" && s.Retention != "workqueue" {
		bad("intake.stream.retention", "must be limits or workqueue, got %q", s.Retention)
	}
	if s.Replicas < 1 || s.Replicas > 5 {
		bad("intake.stream.replicas", "must be 1..5, got %d", s.Replicas)
	}
	if s.MaxAge < 0 {
		bad("intake.stream.max_age", "must be 0 (unlimited) or positive, got %s", s.MaxAge)
	}
	if s.MaxBytes < 0 {
		bad("intake.stream.max_bytes", "must be 0 (unlimited) or positive, got %d", s.MaxBytes)
	}
	if s.Pull < 1 || s.Pull > 65536 {
		bad("intake.stream.pull", "must be 1..65536, got %d", s.Pull)
	}
	if s.PullBytes < 0 {
		bad("intake.stream.pull_bytes", "must be 0 (derived from the memory limit) or positive, got %d", s.PullBytes)
	}
	if s.AckWait < time.Second {
		bad("intake.stream.ack_wait", "must be at least 1s, got %s", s.AckWait)
	}
	if s.DedupeWindow != 0 && s.DedupeWindow < 2*s.AckWait {
		bad("intake.stream.dedupe_window", "must be 0 (derived) or at least twice ack_wait (%s), got %s", s.AckWait, s.DedupeWindow)
	}
	if s.RetryDelay <= 0 {
		bad("intake.stream.retry_delay", "must be positive, got %s", s.RetryDelay)
	}
}

// checkNATSURL checks one server of nats.url. Its credentials must be all
// that comes before the last "@", what RedactURL hides: a "/", "?" or "#"
// in them would end the host early in the URL parser, and the rest of a
// password would reach dial errors and logs as a host name or port. The
// parser's own error is not quoted when the URL has credentials, for the
// same reason.
func checkNATSURL(s string) error {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil // nats.go skips empty entries of the list
	}
	if !strings.Contains(s, "://") {
		s = "nats://" + s // as nats.go reads it
	}
	_, rest, _ := strings.Cut(s, "://")
	at := strings.LastIndex(rest, "@")
	if at >= 0 && strings.ContainsAny(rest[:at], "/?#") {
		return errors.New(`its user, password or token holds "/", "?" or "#": percent-encode them (%2F, %3F, %23)`)
	}
	if _, err := url.Parse(s); err != nil {
		if at >= 0 {
			return errors.New("does not parse as a URL (check the port; percent-encode special characters of the credentials, % as %25)")
		}
		return fmt.Errorf("does not parse as a URL: %w", err)
	}
	return nil
}

// validateNotRedacted refuses the marks `delayd config` prints in place of
// secrets: a daemon started from that output would authenticate with the
// word REDACTED and retry the refusal forever, with no hint why.
func (c Config) validateNotRedacted(bad func(key, format string, args ...any)) {
	for _, key := range SecretKeys {
		if *c.secrets()[key] == redacted {
			bad(key, "is REDACTED, the mark `delayd config` prints in place of a secret: give the secret itself "+
				"(in the config file, %s or --set %s=...)", EnvName(key), key)
		}
	}
	for _, u := range []struct {
		key, list, creds string
	}{
		{"nats.url", c.NATS.URL, "nats.user and nats.password, or nats.token"},
		{"redis.addrs", strings.Join(c.Redis.Addrs, ","), "redis.username and redis.password"},
	} {
		for _, a := range strings.Split(u.list, ",") {
			if redactedCreds(strings.TrimSpace(a)) {
				bad(u.key, "%s: its credentials are REDACTED, the mark `delayd config` prints in place of them: "+
					"give the URL with the real ones (in the config file, %s or --set %s=...), or the credentials in %s",
					strings.TrimSpace(a), EnvName(u.key), u.key, u.creds)
			}
		}
	}
}
