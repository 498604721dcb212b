package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/admin"
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
)

// streamIntake builds the durable stream intake on a connection of its own
// (so its pulls and acks do not queue behind request replies), or nil when
// intake.stream.enabled is false.
func streamIntake(c config.Config, auth bridge.Auth, st *store.Store, w bridge.Waker, m *admin.Metrics,
	o daemonOptions, log hclog.Logger) (*bridge.StreamIntake, error) {
	if !c.StreamEnabled() {
		return nil, nil
	}
	nc, err := bridge.Connect(c.NATS.URL, c.NATS.Name+"-stream", auth, log.Named("nats"), nil, nil)
	if err != nil {
		return nil, err
	}
	s := c.Intake.Stream
	return bridge.NewStreamIntake(nc, st, w, m, bridge.StreamOptions{
		Subject: c.Subject, Name: s.Name, Required: s.Enabled == "true", Replicas: s.Replicas,
		MaxAge: s.MaxAge, MaxBytes: s.MaxBytes, Pull: s.Pull, PullBytes: streamBytes(c), AckWait: s.AckWait, RetryDelay: s.RetryDelay,
		Batch: c.Intake.Batch, Limits: c.EnvelopeLimits(), Policy: c.Policy(), JetStream: c.Targets.JetStream, Now: o.now,
	}, log.Named("stream")), nil
}
