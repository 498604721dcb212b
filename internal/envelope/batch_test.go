package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// batchOf is a JSON batch of n envelopes with payloads of size bytes.
func batchOf(n, size int) []byte {
	type entry struct {
		Headers map[string]string `json:"headers"`
		Payload string            `json:"payload"`
	}
	es := make([]entry, n)
	p := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", size)))
	for i := range es {
		es[i] = entry{Headers: map[string]string{HeaderTarget: "orders.cancel", HeaderDelay: "30m", HeaderID: fmt.Sprintf("order-%d", i)}, Payload: p}
	}
	b, _ := json.Marshal(es)
	return b
}

func TestParseBatch(t *testing.T) {
	h := map[string][]string{HeaderBatch: {BatchJSON}}
	body := []byte(`[{"headers":{"Delayd-Target":"a.b","X-Multi":["1","2"]},"payload":"aGk="},{"headers":{}},{"headers":{},"extra":1},{"headers":{"X":1}},"no",{"payload":"%%"}]`)
	es, err := ParseBatch(h, body, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 6 {
		t.Fatalf("%d entries", len(es))
	}
	if es[0].Err != nil || string(es[0].Payload) != "hi" || !slices.Equal(es[0].Header["X-Multi"], []string{"1", "2"}) || es[0].Header[HeaderTarget][0] != "a.b" {
		t.Errorf("entry 0: %+v", es[0])
	}
	if es[1].Err != nil || es[1].Payload != nil {
		t.Errorf("entry 1 (empty, its checks are ParseSchedule's): %+v", es[1])
	}
	for i := 2; i < 6; i++ {
		if CodeOf(es[i].Err) != CodeBadRequest {
			t.Errorf("entry %d: %v, want 400", i, es[i].Err)
		}
	}
	for _, tc := range []struct {
		h    map[string][]string
		body string
		code int
	}{
		{h, `{}`, CodeBadRequest},
		{h, `[1,2,3,4,5,6,7,8,9,10,11]`, CodeTooLarge},
		{map[string][]string{HeaderBatch: {"cbor"}}, `[]`, CodeBadRequest},
		{map[string][]string{HeaderBatch: {BatchJSON}, "X": {"1"}}, `[]`, CodeBadRequest},
	} {
		if _, err := ParseBatch(tc.h, []byte(tc.body), 10); CodeOf(err) != tc.code {
			t.Errorf("%v %s: %v, want %d", tc.h, tc.body, err, tc.code)
		}
	}
	// A line break in a header would forge headers of the delivered message.
	forged, err := ParseBatch(h, []byte(`[{"headers":{"X":"a\r\nNats-Msg-Id: 1"}},{"headers":{"X: Y":"a"}},{"headers":{"X":"\u00e9t\u00e9"}}]`), 10)
	if err != nil || CodeOf(forged[0].Err) != CodeBadRequest || CodeOf(forged[1].Err) != CodeBadRequest || forged[2].Err != nil || forged[2].Header["X"][0] != "été" {
		t.Errorf("forged headers: %v %+v", err, forged)
	}
	if f, ok := IsBatch(map[string][]string{"delayd-batch": {" json "}}); !ok || f != BatchJSON {
		t.Errorf("IsBatch in lower case: %q %v", f, ok)
	}
	if _, ok := IsBatch(map[string][]string{HeaderTarget: {"x"}}); ok {
		t.Error("a single request is a batch")
	}
}

// A header value that is not UTF-8 travels byte for byte on every intake:
// the request and stream intakes read it from the NATS message
// (ParseSchedule), a batch from the raw bytes of its JSON string, and
// both then keep it as it is, with the Delayd-Id alone held to UTF-8.
// (A batch once refused it while the durable intake stored it.)
func TestHeaderValueNotUTF8(t *testing.T) {
	const v = "caf\xe9 \xff\xfe end"
	r, err := ParseSchedule(map[string][]string{HeaderTarget: {"a.b"}, HeaderDelay: {"1s"}, "X-Latin1": {v}},
		nil, Limits{MaxIDLen: 256, MaxHeaders: 8, MaxHeaderBytes: 1000, MaxDelay: time.Hour}, Policy{}, time.Now())
	if err != nil || !slices.Equal(r.Header["X-Latin1"], []string{v}) {
		t.Errorf("a request: %v %q", err, r.Header)
	}
	es, err := ParseBatch(map[string][]string{HeaderBatch: {BatchJSON}},
		[]byte(`[{"headers":{"X-Latin1":"`+v+`","X-Many":["`+v+`","\u00e9"],"X-Esc":"\\`+v+`"}}]`), 10)
	if err != nil || len(es) != 1 || es[0].Err != nil || !slices.Equal(es[0].Header["X-Latin1"], []string{v}) ||
		!slices.Equal(es[0].Header["X-Many"], []string{v, "é"}) || !slices.Equal(es[0].Header["X-Esc"], []string{"\\" + v}) {
		t.Errorf("a batch: %v %+v", err, es)
	}
}

// raceEnabled: the test binary is built with -race (race_test.go).
var raceEnabled bool

// A body nested deeper than an envelope needs is refused whole before the
// reader descends: the reader once recursed once per bracket, so 1 MB of
// "[" took 200 MB of stack and 8 MB overflowed it, crashing the daemon.
func TestParseBatchDepth(t *testing.T) {
	h := map[string][]string{HeaderBatch: {BatchJSON}}
	deep := map[string][]byte{
		"brackets":       bytes.Repeat([]byte("["), 1<<20),
		"objects":        append([]byte("["), bytes.Repeat([]byte(`{"a":`), 1<<20/5)...),
		"header value":   []byte(`[{"headers":{"X":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`),
		"over the limit": []byte(`[1,` + strings.Repeat("[", 1<<20)),
	}
	for name, body := range deep {
		_, err := ParseBatch(h, body, 1)
		if CodeOf(err) != CodeBadRequest || !strings.Contains(err.Error(), fmt.Sprintf("nested deeper than %d", MaxBatchDepth)) {
			t.Errorf("%s: %v, want 400 nested deeper than %d", name, err, MaxBatchDepth)
		}
	}
	// Nothing allocated per level: a deep body costs what a shallow one does.
	// (The shallow body's error is past byte 255 too: a smaller offset is
	// boxed for the message without an allocation.)
	shallowBody := []byte("[" + strings.Repeat(" ", 300) + strings.Repeat("[", MaxBatchDepth))
	shallow := testing.AllocsPerRun(5, func() { _, _ = ParseBatch(h, shallowBody, 1) })
	if n := testing.AllocsPerRun(5, func() { _, _ = ParseBatch(h, deep["brackets"], 1) }); n > shallow && !raceEnabled {
		t.Errorf("%v allocations for 1 MB of [, %v for %d", n, shallow, MaxBatchDepth+1)
	}
	// The documented shape at its deepest, and unknown values up to the
	// limit, still parse.
	ok := `[{"headers":{"X":["1","2"]},"extra":` + strings.Repeat("[", MaxBatchDepth-2) + strings.Repeat("]", MaxBatchDepth-2) + `}]`
	es, err := ParseBatch(h, []byte(ok), 1)
	if err != nil || len(es) != 1 || CodeOf(es[0].Err) != CodeBadRequest {
		t.Errorf("nested %d deep: %v %+v", MaxBatchDepth, err, es)
	}
	over := `[{"extra":` + strings.Repeat("[", MaxBatchDepth-1) + strings.Repeat("]", MaxBatchDepth-1) + `}]`
	if _, err := ParseBatch(h, []byte(over), 1); CodeOf(err) != CodeBadRequest {
		t.Errorf("nested %d deep: %v, want 400", MaxBatchDepth+1, err)
	}
}

// BenchmarkParseBatch: what the JSON format costs per envelope (100
// envelopes of 128 B, as the bench sends them).
func BenchmarkParseBatch(b *testing.B) {
	h := map[string][]string{HeaderBatch: {BatchJSON}}
	body := batchOf(100, 128)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseBatch(h, body, 1000); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100/1000, "µs/envelope")
}

// The hand-written reader accepts only JSON, never panics, and reads what
// encoding/json reads from a body of the documented shape, but for the
// bytes of a header value that are not UTF-8, which it keeps.
func FuzzParseBatch(f *testing.F) {
	f.Add(batchOf(2, 3))
	f.Add([]byte(`[{"headers":{"A":["1","2"],"B":"\u00e9\ud83d\ude00\n"},"payload":"aGk="},{"payload":null},[],"x",1.5e3,true]`))
	f.Add([]byte(`[{"headers":{"A":"\ud800"}}]`))
	f.Add([]byte("[{\"headers\":{\"A\":\"caf\xe9 \xff\"}}]"))
	f.Add(bytes.Repeat([]byte("["), 4096))
	f.Add(append([]byte("["), bytes.Repeat([]byte(`{"a":`), 4096)...))
	h := map[string][]string{HeaderBatch: {BatchJSON}}
	f.Fuzz(func(t *testing.T, body []byte) {
		es, err := ParseBatch(h, body, 1000)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		var want []struct {
			Headers map[string]any `json:"headers"`
			Payload []byte         `json:"payload"`
		}
		if json.Unmarshal(body, &want) != nil {
			return // some entry is of another shape: refused alone
		}
		for i, e := range es {
			if e.Err != nil {
				continue
			}
			if !slices.Equal(e.Payload, want[i].Payload) && (len(e.Payload) != 0 || len(want[i].Payload) != 0) {
				t.Fatalf("entry %d: payload %q, encoding/json %q", i, e.Payload, want[i].Payload)
			}
			for k, v := range want[i].Headers {
				var vs []string
				switch v := v.(type) {
				case string:
					vs = []string{v}
				case []any:
					for _, x := range v {
						vs = append(vs, x.(string))
					}
				}
				// encoding/json reads a byte that is not UTF-8 as U+FFFD;
				// the batch keeps it, as a NATS header does.
				kept := make([]string, len(e.Header[k]))
				for j, x := range e.Header[k] {
					kept[j] = string([]rune(x))
				}
				if len(vs) > 0 && !slices.Equal(kept, vs) {
					t.Fatalf("entry %d header %q: %q, encoding/json %q", i, k, e.Header[k], vs)
				}
			}
		}
	})
}

// An error quotes at most QuoteMax bytes of a publisher's value.
func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"orders.cancel":                `"orders.cancel"`,
		strings.Repeat(">", 1000):      strconv.Quote(strings.Repeat(">", QuoteMax) + "…"),
		strings.Repeat("é", 100):       strconv.Quote(strings.Repeat("é", QuoteMax/2) + "…"),
		"x" + strings.Repeat("é", 100): strconv.Quote("x" + strings.Repeat("é", (QuoteMax-1)/2) + "…"),
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%d bytes) = %s, want %s", len(in), got, want)
		}
	}
	_, err := ParseSchedule(map[string][]string{HeaderTarget: {"t." + strings.Repeat(">", 1000)}, HeaderDelay: {"1m"}}, nil, Limits{}, Policy{}, time.Now())
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("a long target's refusal: %v", err)
	}
}
