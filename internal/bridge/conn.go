// Package bridge speaks NATS for the daemon: the intake service (schedule,
// cancel, admin), the stream intake and the delivery publisher, and the
// connections of the CLI and the bench. The requests a client sends to
// delayd are the public package github.com/delayd/delayd/client's.
package bridge

import (
	"crypto/tls"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
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
		return nil, fmt.Errorf("connect to NATS at %s: %w", config.RedactURL(url), err)
	}
	return nc, nil
}

// Connect opens a connection that keeps retrying, in the background, when
// the server is down at start or goes away later: delayd must outlive NATS
// outages rather than crash-loop. Reconnects are logged.
// onReconnect, if not nil, is called after each reconnection; refusals, if
// not nil, records the server's permission refusals for a Publisher.
func Connect(url, name string, auth Auth, log hclog.Logger, onReconnect func(), refusals *Refusals) (*nats.Conn, error) {
	authOpts, err := auth.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(authOpts,
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted())
			if onReconnect != nil {
				onReconnect()
			}
		}),
		nats.ConnectHandler(func(c *nats.Conn) {
			log.Info("NATS connected", "url", c.ConnectedUrlRedacted())
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
		return nil, fmt.Errorf("bridge: connect %s: %w", config.RedactURL(url), err)
	}
	if !nc.IsConnected() {
		log.Warn("NATS not reachable yet, retrying in the background", "url", config.RedactURL(url))
	}
	return nc, nil
}
