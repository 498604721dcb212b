package intake

// Batch requests: many envelopes in one message (Delayd-Batch, see
// envelope.ParseBatch and docs/protocol.md). Each envelope is checked and
// answered on its own; the valid ones join the same queue as single
// requests, so the flushers write them in the same pipelines (one Redis
// call for a whole batch on a single Redis), and the last one stored
// sends the batch's one reply.

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// DefaultMaxBatch is intake.max_batch's default: envelopes per batch.
const DefaultMaxBatch = 1000

// batchReply is a batch request's reply on its way: each envelope's result
// is set at its place, and the last one set answers the batch.
type batchReply struct {
	group
	in      *Intake
	reply   string
	results [][]byte // each envelope's result, JSON
	start   time.Time
}

// settle sets an envelope's result. Each place is set by one flusher; the
// group's count orders the writes before the last one's read.
func (g *batchReply) settle(it *item) {
	g.results[it.idx] = result(it)
	if !g.done(g.in.held) {
		return
	}
	if g.reply != "" {
		if err := g.in.nc.Publish(g.reply, g.body()); err != nil {
			g.in.log.Warn("reply failed", "error", err)
		}
	}
	g.in.replied(g.start)
}

// result is an envelope's result, in a batch's reply or alone: its id and
// due time, or its failure (with the id to resend with after a 504).
func result(it *item) []byte {
	id := it.ID
	if it.out.err == nil {
		return appendScheduled(make([]byte, 0, 56+len(id)), id, it.out.DueMs)
	}
	code, msg, _ := storeFailure(id, it.out.err)
	if code != codeOutcomeUnknown {
		id = ""
	}
	return failureResult(id, code, msg)
}

// body is the batch's reply: {"results":[...]} in the envelopes' order.
func (g *batchReply) body() []byte {
	n := len(`{"results":[]}`)
	for _, r := range g.results {
		n += len(r) + 1
	}
	b := append(make([]byte, 0, n), `{"results":[`...)
	for i, r := range g.results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	return append(b, `]}`...)
}

// batchFailure is the result of an envelope that was not stored.
type batchFailure struct {
	// ID is the id to resend with after a 504; "" otherwise.
	ID    string `json:"id,omitempty"`
	Code  int    `json:"code"`
	Error string `json:"error"`
}

func failureResult(id string, code int, msg string) []byte {
	b, _ := json.Marshal(batchFailure{ID: id, Code: code, Error: capText(msg)})
	return b
}

// maxErrorText bounds an envelope's error text in a batch reply. The
// refusals quote a publisher's values at most envelope.QuoteMax bytes
// each; this is the backstop that keeps every refusal, whatever it
// quotes, from crowding the others out of the reply's max_payload.
const maxErrorText = 512

// capText cuts msg to maxErrorText bytes, on a rune boundary, marked "…".
func capText(msg string) string {
	if len(msg) <= maxErrorText {
		return msg
	}
	cut := maxErrorText - len("…")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// worstResult is the most bytes the result of a queued envelope of this id
// can take: the longest store failure, a 504 that names the id twice,
// outgrows a success (the id and a due time) and the 503s, which name no
// id (TestWorstResult).
func worstResult(id string) int {
	n := len(id)
	if !plainJSON(id) {
		b, _ := json.Marshal(id)
		n = len(b) - 2
	}
	return len(`{"id":"","code":504,"error":""}`) + len(notReplicatedMsg) + 2*n
}

// replyBound is the most bytes a batch's reply can take: the refusals as
// they are, each queued envelope at its worst.
func replyBound(results [][]byte, queued []item) int {
	n := len(`{"results":[]}`) + max(len(results)-1, 0)
	for _, r := range results {
		n += len(r)
	}
	for _, p := range queued {
		n += worstResult(p.ID)
	}
	return n
}

// handleBatch takes a batch request: refused as a whole (nothing stored)
// when the batch itself is malformed or over intake.max_batch, else each
// envelope is refused or queued on its own.
func (in *Intake) handleBatch(req micro.Request, h map[string][]string) {
	start := in.opt.Now()
	entries, err := envelope.ParseBatch(h, req.Data(), in.opt.MaxBatch)
	if err != nil {
		in.count(envelope.CodeOf(err))
		in.reject(now(req), err)
		return
	}
	g := &batchReply{in: in, reply: req.Reply(), results: make([][]byte, len(entries)), start: start}
	queued := batchItems(entries, g, start, func(_ int, e envelope.BatchEntry) (store.Item, error) {
		return in.check.item(e.Header, e.Payload, func() (string, error) { return nuid.Next(), nil })
	}, func(i int, _ envelope.BatchEntry, err error) {
		code := envelope.CodeOf(err)
		in.count(code)
		g.results[i] = failureResult("", code, err.Error())
	})
	if limit := in.nc.MaxPayload(); limit > 0 && int64(replyBound(g.results, queued)) > limit {
		// Its reply could not be sent: refused whole before anything is
		// stored, so the promise of one result per envelope holds.
		in.count(envelope.CodeTooLarge)
		in.reject(now(req), &envelope.Error{Code: envelope.CodeTooLarge, Msg: fmt.Sprintf(
			"the reply to these %d envelopes could take %d bytes and would exceed max_payload %d: nothing of the batch stored, send fewer envelopes", len(entries), replyBound(g.results, queued), limit)})
		return
	}
	if len(queued) == 0 {
		// Nothing for Redis: answered at once.
		if g.reply != "" {
			if err := req.Respond(g.body()); err != nil {
				in.log.Warn("reply failed", "error", err)
			}
		}
		return
	}
	if !in.take(&g.group, requestBytes(req.Data(), req.Headers()), queued...) {
		// Refused whole, as a single request is: nothing of it is stored,
		// and the client resends the batch as it is.
		in.count(envelope.CodeUnavailable)
		in.reject(now(req), &envelope.Error{Code: envelope.CodeUnavailable, Msg: "delayd is stopping: nothing of the batch stored, retry"})
	}
}
