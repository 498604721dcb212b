package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
)

// Schedule a message 100 ms ahead and receive it on its target.
func Example() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	sub, _ := nc.SubscribeSync("orders.cancel")

	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Schedule(ctx, "orders.cancel", []byte("order 42"),
		client.Delay(100*time.Millisecond), client.ID("order-42"), client.Header("traceparent", "00-abc-def-01"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("scheduled", s.ID)

	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("got %q, Delayd-Id %s, traceparent %s\n", m.Data, m.Header.Get("Delayd-Id"), m.Header.Get("traceparent"))
	// Output:
	// scheduled order-42
	// got "order 42", Delayd-Id order-42, traceparent 00-abc-def-01
}

func ExampleClient_Cancel() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	c := client.New(nc)
	ctx := context.Background()

	if _, err := c.Schedule(ctx, "reminders.send", []byte("call back"), client.Delay(time.Hour), client.ID("reminder-7")); err != nil {
		fmt.Println(err)
		return
	}
	r, err := c.Cancel(ctx, "reminder-7")
	fmt.Println(r.Cancelled, err)
	// A second cancel finds nothing: that is an answer, not an error.
	r, err = c.Cancel(ctx, "reminder-7")
	fmt.Println(r.Cancelled, err)
	// Output:
	// true <nil>
	// false <nil>
}

// Refusals match the sentinel errors; the *ServiceError says why.
func ExampleServiceError() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	c := client.New(nc)

	_, err := c.Schedule(context.Background(), "$SYS.REQ.SERVER.PING", nil, client.Delay(time.Second))
	fmt.Println(errors.Is(err, client.ErrForbidden))
	var se *client.ServiceError
	if errors.As(err, &se) {
		fmt.Println(se.Code)
	}
	// Options are checked before anything is sent.
	_, err = c.Schedule(context.Background(), "orders.cancel", nil, client.Delay(time.Second), client.At(time.Now()))
	fmt.Println(errors.Is(err, client.ErrBadRequest))
	// Output:
	// true
	// 403
	// true
}

// ScheduleRetrying makes an id and resends with it until the envelope is
// stored, so a timeout or a Redis outage never loses it nor doubles it.
func ExampleClient_ScheduleRetrying() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	c := client.New(nc, client.RetryTimeout(2*time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.ScheduleRetrying(ctx, "invoices.send", []byte("invoice 9"), client.At(time.Now().Add(time.Hour)))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.ID != "", time.Until(s.DeliverAt).Round(time.Hour))
	// Output:
	// true 1h0m0s
}

// Publish goes through the durable stream intake: acknowledged by
// JetStream, stored by delayd when it can.
func ExampleClient_Publish() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	sub, _ := nc.SubscribeSync("emails.send")
	c := client.New(nc)

	p, err := c.Publish(context.Background(), "emails.send", []byte("welcome"), client.Delay(50*time.Millisecond), client.ID("welcome-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acknowledged by", p.Stream, "as", p.ID)
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("got %q, Delayd-Id %s\n", m.Data, m.Header.Get("Delayd-Id"))
	// Output:
	// acknowledged by DELAYD_INTAKE as welcome-1
	// got "welcome", Delayd-Id welcome-1
}

// Schedule three reminders in one request: each envelope stands alone, so
// the one with a wildcard target is refused and the others are stored.
func ExampleClient_ScheduleBatch() {
	nc, _ := nats.Connect(daemonURL())
	defer nc.Close()
	c := client.New(nc)
	ctx := context.Background()

	res, err := c.ScheduleBatch(ctx, []client.Envelope{
		{Target: "reminders.send", Payload: []byte("call Ada"), Options: []client.ScheduleOption{client.Delay(time.Hour), client.ID("rem-1")}},
		{Target: "reminders.*", Payload: []byte("call everyone"), Options: []client.ScheduleOption{client.Delay(time.Hour)}},
		{Target: "reminders.send", Payload: []byte("call Bob"), Options: []client.ScheduleOption{client.Delay(time.Hour), client.ID("rem-3")}},
	})
	if err != nil {
		fmt.Println(err) // the batch as a whole: nothing, or anything, may be stored
		return
	}
	for _, r := range res {
		fmt.Println(r.ID, errors.Is(r.Err, client.ErrBadRequest))
	}
	_, _ = c.Cancel(ctx, "rem-1")
	_, _ = c.Cancel(ctx, "rem-3")
	// Output:
	// rem-1 false
	//  true
	// rem-3 false
}
