package daemontest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream creates a JetStream stream over subjects with a 1 min duplicate
// window.
func (e *Env) Stream(name string, subjects ...string) jetstream.Stream {
	e.T.Helper()
	nc := e.Conn()
	e.T.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		e.T.Fatal(err)
	}
	s, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects, Duplicates: time.Minute})
	if err != nil {
		e.T.Fatal(err)
	}
	return s
}

// StreamMsgs is the number of messages in s.
func StreamMsgs(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// CaptureStream makes a stream that records every core publish on subjects
// without deduplication, so duplicates stay visible and countable.
func (e *Env) CaptureStream(name, subject string) jetstream.Stream {
	e.T.Helper()
	nc := e.Conn()
	e.T.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	s, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		e.T.Fatal(err)
	}
	return s
}
