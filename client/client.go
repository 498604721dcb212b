package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// DefaultPrefix is the subject prefix of a delayd whose subject setting
// is unchanged.
const DefaultPrefix = "delayd"

// Client talks to delayd over a NATS connection. It is safe for
// concurrent use.
type Client struct {
	nc           *nats.Conn
	prefix       string
	retryTimeout time.Duration
	owned        bool     // Close closes nc
	batch        *batcher // the Batching option's, or nil
}

// Option configures a Client.
type Option func(*Client)

// Prefix sets the subject prefix, the daemon's subject setting (default
// "delayd"): requests go to <prefix>.schedule, <prefix>.cancel, ...
func Prefix(prefix string) Option { return func(c *Client) { c.prefix = prefix } }

// RetryTimeout bounds each attempt of ScheduleRetrying (default 10 s,
// above the daemon's default store timeout of 5 s, so a slow Redis is
// answered with 504 before the attempt gives up).
func RetryTimeout(d time.Duration) Option { return func(c *Client) { c.retryTimeout = d } }

// New returns a client over an existing connection, which stays the
// caller's to close.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := &Client{nc: nc, prefix: DefaultPrefix, retryTimeout: 10 * time.Second}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Connect opens a NATS connection to url and returns a client that owns
// it: Close closes it.
func Connect(url string, natsOpts []nats.Option, opts ...Option) (*Client, error) {
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		return nil, fmt.Errorf("delayd client: connect to NATS: %w", err)
	}
	c := New(nc, opts...)
	c.owned = true
	return c, nil
}

// Close stops the Batching option's batches (waiting for those in
// flight) and closes the connection if Connect opened it; a connection
// given to New is left open.
func (c *Client) Close() {
	if c.batch != nil {
		c.batch.shutdown()
	}
	if c.owned {
		c.nc.Close()
	}
}

// Cancelled is the answer to a cancel.
type Cancelled struct {
	ID string `json:"id"`
	// Cancelled is false when no envelope had the id (never stored,
	// already delivered, or cancelled before).
	Cancelled bool `json:"cancelled"`
	// InFlight: the envelope was being delivered when it was cancelled,
	// so one delivery may still arrive.
	InFlight bool `json:"in_flight,omitempty"`
}

// Cancel removes the envelope with id. A missing id is not an error:
// Cancelled.Cancelled is false.
func (c *Client) Cancel(ctx context.Context, id string) (Cancelled, error) {
	if id == "" {
		return Cancelled{}, badRequest("cancel", "empty id")
	}
	var out Cancelled
	err := c.request(ctx, "cancel", id, &nats.Msg{Header: nats.Header{headerID: []string{id}}}, &out)
	return out, err
}

// request sends m to <prefix>.<verb> and decodes the JSON reply into out.
// id, if known, goes into the error of an unknown outcome.
func (c *Client) request(ctx context.Context, verb, id string, m *nats.Msg, out any) error {
	resp, err := c.roundTrip(ctx, verb, verb, id, m)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		return fmt.Errorf("delayd %s: bad reply %q: %w", verb, resp.Data, err)
	}
	return nil
}

// roundTrip sends m to <prefix>.<subject> and returns the reply, or the
// error it or the sending gave; verb names the call in errors, id (if
// known) goes into the error of an unknown outcome.
func (c *Client) roundTrip(ctx context.Context, verb, subject, id string, m *nats.Msg) (*nats.Msg, error) {
	m.Subject = c.prefix + "." + subject
	if err := ctx.Err(); err != nil {
		// Nothing reached delayd: as with any request that could not be
		// sent, nothing was written.
		return nil, fmt.Errorf("delayd %s: not sent: %w: %w", verb, ErrUnavailable, err)
	}
	resp, err := c.nc.RequestMsgWithContext(ctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("delayd %s: no delayd service answers on %s: is the daemon running? (%w: %w)", verb, m.Subject, ErrUnavailable, err)
	case notSent(err) != nil:
		return nil, fmt.Errorf("delayd %s: not sent: %w", verb, notSent(err))
	case err != nil && ctx.Err() != nil:
		// The request went out: a daemon may have stored it and its reply
		// come too late. Retrying with the same id is safe.
		return nil, &unknownOutcome{verb: verb, id: id, err: err}
	case err != nil:
		return nil, fmt.Errorf("delayd %s: %w", verb, err)
	}
	if msg := resp.Header.Get(micro.ErrorHeader); msg != "" {
		se := &ServiceError{Message: msg}
		se.Code, _ = strconv.Atoi(resp.Header.Get(micro.ErrorCodeHeader))
		if len(resp.Data) > 0 {
			var body struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(resp.Data, &body) == nil {
				se.ID = body.ID
			}
		}
		return nil, se
	}
	return resp, nil
}

// notSent maps the errors with which nats.go refuses to send a message
// (nothing reached delayd) to the sentinel that says why, or nil: a closed
// or draining connection is ErrUnavailable, a message over the server's
// max_payload ErrTooLarge.
func notSent(err error) error {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return nil
}

// unknownOutcome is a request that got no reply before its context ended.
// It matches ErrOutcomeUnknown and the context's error.
type unknownOutcome struct {
	verb, id string
	err      error
}

func (e *unknownOutcome) Error() string {
	s := fmt.Sprintf("delayd %s: no reply before the context ended (%v): the outcome is unknown", e.verb, e.err)
	if e.id != "" {
		s += "; retry with id " + e.id
	}
	return s
}

func (e *unknownOutcome) Unwrap() []error { return []error{ErrOutcomeUnknown, e.err} }
