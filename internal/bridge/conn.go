// Package bridge is the only package that speaks NATS: the intake service
// (schedule, cancel), the delivery publisher, and the client used by the CLI.
package bridge

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
)

// Connect opens a connection that keeps retrying, in the background, when
// the server is down at start or goes away later: delayd must outlive NATS
// outages rather than crash-loop. Reconnects are logged.
// onReconnect, if not nil, is called after each reconnection.
func Connect(url, name string, log hclog.Logger, onReconnect func()) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
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
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("bridge: connect %s: %w", url, err)
	}
	if !nc.IsConnected() {
		log.Warn("NATS not reachable yet, retrying in the background", "url", url)
	}
	return nc, nil
}
