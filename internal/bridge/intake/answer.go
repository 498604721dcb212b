package intake

// How the request intake answers: at once from a handler, or later from a
// flush, with the NATS micro error convention for refusals.

import (
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/envelope"
)

func (in *Intake) reject(reply answer, err error) {
	code := envelope.CodeOf(err)
	if reply.subject == "" {
		in.log.Warn("rejected a request without a reply subject", "code", code, "error", err)
	}
	in.fail(reply, code, err.Error())
}

// answer is where a reply goes: the micro request while its handler runs,
// so micro counts an error reply in $SRV.STATS (num_errors, last_error), or
// a reply subject for a reply sent after the handler returned (a batched
// schedule), whose errors the intake counts itself (lateErrors).
type answer struct {
	req     micro.Request // nil once the handler returned
	subject string
}

// now answers req from within its handler.
func now(req micro.Request) answer { return answer{req: req, subject: req.Reply()} }

// later answers a request after its handler returned.
func later(subject string) answer { return answer{subject: subject} }

// fail answers with the NATS micro error convention. It counts nothing in
// delayd's metrics: each endpoint counts its own outcomes.
func (in *Intake) fail(reply answer, code int, msg string) {
	in.failWith(reply, code, msg, nil)
}

// failWith is fail with a body (the id of a 504).
func (in *Intake) failWith(reply answer, code int, msg string, body []byte) {
	if reply.req != nil {
		// Counted by micro even without a reply subject (a plain
		// publish), as the refusal it is.
		if err := reply.req.Error(strconv.Itoa(code), msg, body); err != nil && reply.subject != "" {
			in.log.Warn("error reply failed", "error", err)
		}
		return
	}
	in.late.record(code, msg)
	if reply.subject == "" {
		return
	}
	m := &nats.Msg{Subject: reply.subject, Data: body, Header: nats.Header{
		micro.ErrorHeader:     []string{msg},
		micro.ErrorCodeHeader: []string{strconv.Itoa(code)},
	}}
	if err := in.nc.PublishMsg(m); err != nil {
		in.log.Warn("error reply failed", "error", err)
	}
}

// lateErrors counts the error replies sent after their handler returned,
// which micro cannot see: they are reported in the schedule endpoint's
// stats data (late_errors, last_late_error).
type lateErrors struct {
	mu   sync.Mutex
	n    int
	last string
}

func (l *lateErrors) record(code int, msg string) {
	l.mu.Lock()
	l.n++
	l.last = strconv.Itoa(code) + ": " + msg
	l.mu.Unlock()
}

func (l *lateErrors) stats() map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return map[string]any{"late_errors": l.n, "last_late_error": l.last}
}
