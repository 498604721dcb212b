package intake

import "strings"

// stampedHeaders are the headers nats-server itself writes on a message
// that reaches the intake stream through another stream, taken from
// nats-server's source (server/stream.go, server/accounts.go, v2.15):
//   - Nats-Stream-Source (JSStreamSource): on every message a stream
//     sources from another; 2.15 refuses it from a client publish;
//   - Nats-Stream, Nats-Subject, Nats-Sequence, Nats-Time-Stamp,
//     Nats-Last-Sequence (JSStream, JSSubject, JSSequence, JSTimeStamp,
//     JSLastSequence) and Nats-Msg-Size (JSMsgSize, headers_only): on a
//     message a stream republishes (RePublish) onto an intake subject;
//   - Nats-Request-Info (ClientInfoHdr): on a message that crossed a
//     service import into delayd's account.
//
// The stream intake drops them: they describe the message's way into the
// intake, not the message for the target. They are never passed on: a
// target stream on 2.15 refuses a publish that carries Nats-Stream-Source,
// and Nats-Request-Info names the publisher's account, user and address.
// A publisher that writes one itself gains nothing: it is dropped as well.
// Mirrors copy messages unchanged and stamp nothing.
var stampedHeaders = []string{
	"Nats-Stream-Source",
	"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Last-Sequence", "Nats-Msg-Size",
	"Nats-Request-Info",
}

// isStampedHeader reports whether k is one of stampedHeaders.
func isStampedHeader(k string) bool {
	for _, s := range stampedHeaders {
		if strings.EqualFold(k, s) {
			return true
		}
	}
	return false
}

// requestHeaders drops from a schedule request the one header nats-server
// stamps on a request intake: Nats-Request-Info, written on every request
// that crossed a service import (a publisher in another account importing
// delayd's service), which delayd refused with 400 as a publisher's
// Nats-* header, so such an import could not schedule at all. Every other
// Nats-* header of a request stays, to be refused: on a plain request
// delayd cannot tell a stamp from a publisher's header.
func requestHeaders(h map[string][]string) map[string][]string {
	const info = "Nats-Request-Info"
	found := false
	for k := range h {
		if strings.EqualFold(k, info) {
			found = true
			break
		}
	}
	if !found {
		return h
	}
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if !strings.EqualFold(k, info) {
			out[k] = v
		}
	}
	return out
}
