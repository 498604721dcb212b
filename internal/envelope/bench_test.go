package envelope

import (
	"testing"
	"time"
)

func benchEnvelope() Envelope {
	return Envelope{
		Target:  "orders.cancel",
		Header:  map[string][]string{"traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		Payload: make([]byte, 128),
	}
}

func BenchmarkEncode(b *testing.B) {
	e := benchEnvelope()
	b.ReportAllocs()
	for b.Loop() {
		_ = Encode(e)
	}
}

func BenchmarkDecode(b *testing.B) {
	data := Encode(benchEnvelope())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseSchedule(b *testing.B) {
	h := map[string][]string{
		"Delayd-Target": {"orders.cancel"},
		"Delayd-Delay":  {"30m"},
		"Delayd-Id":     {"order-0000000042"},
		"traceparent":   {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	lim := Limits{MaxPayload: 1 << 20, MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: 24 * time.Hour}
	pol := Policy{Prefix: "delayd"}
	payload := make([]byte, 128)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseSchedule(h, payload, lim, pol, now); err != nil {
			b.Fatal(err)
		}
	}
}
