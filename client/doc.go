// Package client is the Go client of delayd, the sidecar that gives NATS
// publishers delayed delivery.
//
// The protocol is plain NATS, so any client can speak it; this package
// only spells it out. A publisher sends a request to <prefix>.schedule
// (prefix "delayd" unless the daemon's subject setting says otherwise)
// whose body is the payload and whose headers say where and when:
// Delayd-Target (the subject to deliver to), Delayd-At or Delayd-Delay (or,
// for a repeat, Delayd-Every or Delayd-Cron) and optionally Delayd-Id. delayd
// stores it in Redis, answers {"id": ..., "deliver_at": ...}, and when it is
// due publishes the payload, with the caller's other headers plus Delayd-Id,
// Delayd-Due and Delayd-Attempt, to the target. The same Delayd-Id again
// replaces the stored envelope, never duplicates it, which is what makes a
// retry safe. <prefix>.cancel removes one by id. Errors come back with the
// NATS micro headers Nats-Service-Error and Nats-Service-Error-Code, which
// this package turns into a *ServiceError that matches the sentinel errors
// (ErrBadRequest, ErrForbidden, ...) with errors.Is.
//
// ScheduleBatch sends many envelopes in one request (header Delayd-Batch,
// a JSON array of envelopes) and returns a result per envelope; with the
// Batching option, Schedule itself gathers concurrent calls into such
// batches.
//
// Publish is the other way in: a JetStream publish to <prefix>.intake,
// acknowledged by the stream as soon as it is durable, even while every
// delayd is down. Get, List, Stats, Replay and Purge are the operator
// endpoints under <prefix>.admin.>, which NATS permissions usually keep
// from publishers.
package client
