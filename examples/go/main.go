// Command go is a small program using delayd's Go client: it schedules a
// message, cancels another, and receives the first on its target. It
// needs a NATS server with a delayd; NATS_URL says where (default
// nats://127.0.0.1:4222).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	url := getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	c := client.New(nc)

	// Subscribe before scheduling, so the delivery cannot be missed.
	sub, err := nc.SubscribeSync("example.reminders")
	if err != nil {
		return err
	}

	// The same id again would replace the message: safe to retry.
	s, err := c.ScheduleRetrying(ctx, "example.reminders", []byte("time to stretch"),
		client.Delay(200*time.Millisecond), client.ID("stretch-1"))
	if err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	fmt.Fprintln(stdout, "scheduled", s.ID)

	if _, err := c.Schedule(ctx, "example.reminders", []byte("never mind"), client.Delay(time.Hour), client.ID("later-1")); err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	r, err := c.Cancel(ctx, "later-1")
	if err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	fmt.Fprintln(stdout, "cancelled", r.ID, r.Cancelled)

	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	fmt.Fprintf(stdout, "received %q (Delayd-Id %s, attempt %s)\n", m.Data, m.Header.Get("Delayd-Id"), m.Header.Get("Delayd-Attempt"))
	return nil
}
