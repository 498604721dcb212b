package daemontest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
)

// Occurrence is a delivery's Delayd-Occurrence, 0 when it has none.
func (d Delivery) Occurrence() int64 {
	n, _ := strconv.ParseInt(d.Header.Get(envelope.HeaderOccurrence), 10, 64)
	return n
}

// AtLeast is a WaitFor condition: n deliveries or more.
func AtLeast(n int) func([]Delivery) bool {
	return func(ds []Delivery) bool { return len(ds) >= n }
}

// HasOccurrence is a WaitFor condition: occurrence n arrived.
func HasOccurrence(n int64) func([]Delivery) bool {
	return func(ds []Delivery) bool {
		return slices.ContainsFunc(ds, func(d Delivery) bool { return d.Occurrence() == n })
	}
}

// ScheduleOK sends a schedule request that must be accepted.
func ScheduleOK(t testing.TB, nc *nats.Conn, h nats.Header, payload string) client.Scheduled {
	t.Helper()
	rep, err := Schedule(nc, "delayd", h, payload)
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	if e := rep.Header.Get(micro.ErrorHeader); e != "" {
		t.Fatalf("schedule refused: %s %s", rep.Header.Get(micro.ErrorCodeHeader), e)
	}
	var s client.Scheduled
	if err := json.Unmarshal(rep.Data, &s); err != nil {
		t.Fatalf("reply %q: %v", rep.Data, err)
	}
	return s
}

// Describe renders deliveries for failure messages.
func Describe(ds []Delivery) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString("\n  occurrence " + strconv.FormatInt(d.Occurrence(), 10) + " attempt " + strconv.Itoa(d.Attempt) +
			" due " + d.Due.Format("15:04:05.000") + " received " + d.Received.Format("15:04:05.000") + " data " + strconv.Quote(d.Data))
	}
	return b.String()
}

// ScheduleMany sends n schedule requests from the given number of workers.
// Envelope i gets the id prefix+i and the headers set(i, h) adds.
func ScheduleMany(t testing.TB, nc *nats.Conn, n, workers int, prefix string, set func(i int, h nats.Header)) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				ids[i] = prefix + strconv.Itoa(i)
				h := Hdr("Delayd-Id", ids[i])
				set(i, h)
				if rep, err := Schedule(nc, "delayd", h, "x"); err != nil {
					t.Errorf("schedule %s: %v", ids[i], err)
				} else if rep.Header.Get(micro.ErrorHeader) != "" {
					t.Errorf("schedule %s: %v", ids[i], rep.Header)
				}
			}
		}()
	}
	wg.Wait()
	return ids
}

// Readyz reports whether the admin server at addr answers /readyz with 200.
func Readyz(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
