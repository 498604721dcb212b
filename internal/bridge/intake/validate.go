package intake

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/bridge/delivery"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// validator is what both intakes (request/reply and stream) check before a
// schedule is stored.
type validator struct {
	nc        *nats.Conn // for the server's max_payload
	limits    envelope.Limits
	policy    envelope.Policy
	jetStream []string // targets.jetstream: their deliveries carry a Nats-Msg-Id
	now       func() time.Time
	// resends: delivered requests are remembered (intake.dedupe_window),
	// so a one-shot with a publisher's id carries its fingerprint.
	resends bool
}

// item validates a schedule and turns it into a store item. newID names
// an envelope that has no Delayd-Id. A rejection is an *envelope.Error.
func (v validator) item(h map[string][]string, data []byte, newID func() (string, error)) (store.Item, error) {
	return v.itemAt(h, data, newID, v.now())
}

// itemAt is item for a request accepted at now: the stream intake passes
// the time the stream took the message, so that a message that waited in
// the stream (no delayd running) is judged, and its lateness counted, from
// when it was published.
func (v validator) itemAt(h map[string][]string, data []byte, newID func() (string, error), now time.Time) (store.Item, error) {
	lim := v.limits
	srvMax := int(v.nc.MaxPayload())
	if srvMax > 0 && (lim.MaxPayload == 0 || srvMax < lim.MaxPayload) {
		lim.MaxPayload = srvMax // 0 follows the server
	}
	r, err := envelope.ParseSchedule(h, data, lim, v.policy, now)
	if err != nil {
		return store.Item{}, err
	}
	if v.resends && r.ID != "" && r.Series == nil {
		// A generated id can never be resent, and a series lives on
		// under its id: only a publisher's one-shot can be a resend.
		r.Request = r.Fingerprint()
	}
	if r.ID == "" {
		if r.ID, err = newID(); err != nil {
			return store.Item{}, err
		}
	}
	if r.Jitter > 0 {
		// Here, once the id is known: the offset is the id's, so a resend
		// lands on the same due time. Added to a delay rather than made a
		// time, so that Redis' clock still makes the due time.
		if off := envelope.JitterOffset(r.ID, 1, r.Jitter); r.HasAt {
			r.At = r.At.Add(off)
		} else {
			r.Delay += off
		}
	}
	if srvMax > 0 {
		// The delivery carries more headers than the request: refuse now
		// what could never be delivered.
		if n := delivery.Size(r.Envelope, r.ID, envelope.MatchAny(v.jetStream, r.Target)); n > srvMax {
			return store.Item{}, &envelope.Error{Code: envelope.CodeTooLarge, Msg: fmt.Sprintf(
				"the delivered message would be %d bytes (payload plus headers, with delayd's), over the NATS server's max_payload of %d", n, srvMax)}
		}
	}
	it := store.Item{ID: r.ID, Data: envelope.Encode(r.Envelope), Series: r.Series != nil, Request: r.Request}
	if r.HasAt {
		// Round up to the µs so that rounding never makes it early.
		it.Absolute, it.AtMicros = true, ceilMicros(r.At.UnixMicro(), r.At.Nanosecond()%1000)
	} else {
		it.DelayMicros = ceilMicros(int64(r.Delay/time.Microsecond), int(r.Delay%time.Microsecond))
	}
	return it, nil
}

// ceilMicros rounds us up when the nanoseconds left over are positive,
// without the overflow of adding 999 ns first.
func ceilMicros(us int64, restNanos int) int64 {
	if restNanos > 0 {
		return us + 1
	}
	return us
}
