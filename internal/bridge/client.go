package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/envelope"
)

// ServiceError is an error answer from the delayd service.
type ServiceError struct {
	Code int
	Msg  string
}

func (e *ServiceError) Error() string { return fmt.Sprintf("%s (code %d)", e.Msg, e.Code) }

// ErrNoService means no delayd answered on the service subject.
var ErrNoService = errors.New("no responders")

// Client talks to a delayd service over its public protocol.
type Client struct {
	nc      *nats.Conn
	subject string
}

// Dial connects a client for one-shot commands. Unlike the daemon it fails
// at once when NATS is unreachable: a person is waiting.
func Dial(url, subject string, auth Auth, timeout time.Duration) (*Client, error) {
	opts, err := auth.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name("delayd-cli"), nats.Timeout(timeout))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", config.RedactURL(url), err)
	}
	return &Client{nc: nc, subject: subject}, nil
}

// Close closes the client's connection.
func (c *Client) Close() { c.nc.Close() }

// ScheduleRequest is one envelope to schedule. Set exactly one of At and Delay.
type ScheduleRequest struct {
	Target  string
	At      string // RFC 3339
	Delay   string // Go duration
	ID      string
	Header  map[string][]string
	Payload []byte
}

// Schedule sends a schedule request and waits for the stored reply.
func (c *Client) Schedule(ctx context.Context, r ScheduleRequest) (ScheduleReply, error) {
	h := nats.Header{}
	for k, v := range r.Header {
		h[k] = v
	}
	h.Set(envelope.HeaderTarget, r.Target)
	if r.At != "" {
		h.Set(envelope.HeaderAt, r.At)
	}
	if r.Delay != "" {
		h.Set(envelope.HeaderDelay, r.Delay)
	}
	if r.ID != "" {
		h.Set(envelope.HeaderID, r.ID)
	}
	var out ScheduleReply
	err := c.request(ctx, "schedule", &nats.Msg{Header: h, Data: r.Payload}, &out)
	return out, err
}

// Cancel cancels the envelope with id.
func (c *Client) Cancel(ctx context.Context, id string) (CancelReply, error) {
	var out CancelReply
	err := c.request(ctx, "cancel", &nats.Msg{Header: nats.Header{envelope.HeaderID: []string{id}}}, &out)
	return out, err
}

func (c *Client) request(ctx context.Context, verb string, m *nats.Msg, out any) error {
	m.Subject = c.subject + "." + verb
	resp, err := c.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("delayd %s: no delayd service answers on %s: is the daemon running? (%w)", verb, m.Subject, ErrNoService)
	}
	if err != nil {
		return fmt.Errorf("delayd %s: %w", verb, err)
	}
	if msg := resp.Header.Get(micro.ErrorHeader); msg != "" {
		code, _ := strconv.Atoi(resp.Header.Get(micro.ErrorCodeHeader))
		return &ServiceError{Code: code, Msg: msg}
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		return fmt.Errorf("delayd %s: bad reply %q: %w", verb, resp.Data, err)
	}
	return nil
}

// Get returns what is stored under id.
func (c *Client) Get(ctx context.Context, id string) (EntryInfo, error) {
	var out EntryInfo
	err := c.request(ctx, "admin.get", &nats.Msg{Header: nats.Header{envelope.HeaderID: []string{id}}}, &out)
	return out, err
}

// List returns one page of stored envelopes.
func (c *Client) List(ctx context.Context, r ListRequest) (ListReply, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return ListReply{}, err
	}
	var out ListReply
	err = c.request(ctx, "admin.list", &nats.Msg{Data: body}, &out)
	return out, err
}

// Stats returns the sizes of the delay set.
func (c *Client) Stats(ctx context.Context) (StatsReply, error) {
	var out StatsReply
	err := c.request(ctx, "admin.stats", &nats.Msg{}, &out)
	return out, err
}

// Dead replays or purges dead envelopes; verb is "replay" or "purge".
func (c *Client) Dead(ctx context.Context, verb string, r DeadRequest) (DeadReply, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return DeadReply{}, err
	}
	var out DeadReply
	err = c.request(ctx, "admin."+verb, &nats.Msg{Data: body}, &out)
	return out, err
}
