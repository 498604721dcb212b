// Package bridge speaks NATS for the daemon: the intake service (schedule,
// cancel, admin), the stream intake and the delivery publisher, and the
// connections of the CLI and the bench. The requests a client sends to
// delayd are the public package github.com/delayd/delayd/client's.
package bridge

import (
	"crypto/tls"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/ratelog"
)

// Auth is how delayd authenticates to NATS; at most one method is set.
type Auth struct {
	User, Password string
	Token          string
	NKeySeedFile   string
	CredsFile      string
	// TLS, if not nil, is used for the connection (CA, client cert).
	TLS *tls.Config
	// InboxPrefix replaces "_INBOX" for this connection's reply subjects,
	// so a NATS user can be allowed to subscribe to its own replies only.
	InboxPrefix string
}

func (a Auth) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.User != "" || a.Password != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	case a.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("bridge: nkey seed file: %w", err)
		}
		opts = append(opts, o)
	case a.CredsFile != "":
		if _, err := os.Stat(a.CredsFile); err != nil {
			return nil, fmt.Errorf("bridge: creds file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.TLS != nil {
		opts = append(opts, nats.Secure(a.TLS))
	}
	if a.InboxPrefix != "" && a.InboxPrefix+"." != nats.InboxPrefix {
		opts = append(opts, nats.CustomInboxPrefix(a.InboxPrefix))
	}
	return opts, nil
}

// Dial connects for one-shot commands (the CLI, the bench). Unlike the
// daemon it fails at once when NATS is unreachable: a person is waiting.
func Dial(url, name string, auth Auth, timeout time.Duration) (*nats.Conn, error) {
	opts, err := auth.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name(name), nats.Timeout(timeout))...)
	if err != nil {
		return nil, connectErr("connect to NATS at", url, err)
	}
	return nc, nil
}

// connectErr says which server could not be reached, its credentials
// hidden. The error of a URL that does not parse is not passed on: it
// quotes the whole URL, and the parser's reason may quote part of a
// password (config.Validate refuses such URLs; this is for other callers).
func connectErr(what, url string, err error) error {
	if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
		return fmt.Errorf("%s %s: the URL does not parse", what, config.RedactURL(url))
	}
	return fmt.Errorf("%s %s: %w", what, config.RedactURL(url), err)
}

// connectedURL is the server c is connected to, its credentials hidden:
// nats.go's ConnectedUrlRedacted hides a password but not a token given
// as the user (nats://TOKEN@host:4222).
func connectedURL(c *nats.Conn) string { return config.RedactURL(c.ConnectedUrl()) }

// Connect opens a connection that keeps retrying, in the background, when
// the server is down at start or goes away later: delayd must outlive NATS
// outages rather than crash-loop. Connections, disconnections and failed
// attempts are logged with the server's reason and no credentials.
// onReconnect, if not nil, is called after each reconnection; refusals, if
// not nil, records the server's permission refusals for a Publisher; live,
// if not nil, sets the pings that notice a silent path and records the
// disconnects for a Publisher.
func Connect(url, name string, auth Auth, log hclog.Logger, onReconnect func(), refusals *Refusals, live *Liveness) (*nats.Conn, error) {
	authOpts, err := auth.options()
	if err != nil {
		return nil, err
	}
	servers := config.RedactURL(url)
	// Failed attempts since the last connection: the first is logged with
	// its reason, then one a minute, so an outage does not flood the log.
	// nats.go runs these handlers one at a time, on one goroutine.
	var failed int
	failLog := ratelog.New(time.Minute, nil)
	nc, err := nats.Connect(url, append(append(authOpts, live.options()...),
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		// Keep retrying after the same authorization error twice (nats.go
		// closes the connection for good then): credentials fixed on the
		// server, or rotated into place, must bring the daemon back, as a
		// process that neither connects nor exits is never restarted.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			live.disconnected(err)
			if err != nil {
				log.Warn("NATS disconnected", "url", servers, "error", err)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			// Also called with the first failure of the initial connect,
			// such as "nats: authorization violation".
			failed++
			if ok, _ := failLog.Note(1); ok {
				log.Warn("NATS not reachable, retrying in the background", "url", servers, "attempts", failed, "error", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			failed = 0
			failLog.Reset()
			log.Info("NATS reconnected", "url", connectedURL(c))
			if onReconnect != nil {
				onReconnect()
			}
		}),
		nats.ConnectHandler(func(c *nats.Conn) {
			failed = 0
			failLog.Reset()
			log.Info("NATS connected", "url", connectedURL(c))
		}),
		nats.ClosedHandler(func(c *nats.Conn) {
			// nats.go gives up after the same authentication error twice
			// on a server. A Close of ours has no error, or "no servers"
			// when it ends a reconnect loop (which has no limit).
			if err := c.LastError(); err != nil && !errors.Is(err, nats.ErrNoServers) {
				log.Error("NATS connection closed, no more retries", "url", servers, "error", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Error("NATS async error", "subject", subj, "error", err)
			refusals.record(err)
		}),
	)...)
	if err != nil {
		return nil, connectErr("bridge: connect", url, err)
	}
	return nc, nil
}
