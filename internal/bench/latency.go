package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/delayd/delayd/client"
)

// OneRequester is what one call costs a requester alone: the mean
// microseconds per call over calls in a row, each waiting for its answer.
type OneRequester struct {
	Calls int     `json:"calls"`
	Us    float64 `json:"us_per_call"`
	// EchoUs is the same requests answered at once by a trivial responder
	// on the same server, in the same run: the NATS round trip.
	EchoUs float64 `json:"echo_us_per_call"`
}

// OneRequesterCalls is how many calls in a row a one-requester figure is
// the mean of.
const OneRequesterCalls = 2000

// oneEcho times n requests in a row to an echo responder on p's server.
func oneEcho(ctx context.Context, p *conn, w Workload, n int) (float64, error) {
	one := w
	one.Count, one.Concurrency = n, 1
	rate, _, err := baseline(ctx, []*conn{p}, one, nil)
	if err != nil {
		return 0, fmt.Errorf("echo: %w", err)
	}
	return 1e6 / rate, nil
}

// delaydOneRequester times n schedule calls in a row to delayd (due in an
// hour, and cancelled afterwards so nothing of the bench stays stored),
// and n to an echo responder on the same connection.
func delaydOneRequester(ctx context.Context, p *conn, w Workload, n int) (OneRequester, error) {
	echo, err := oneEcho(ctx, p, w, n)
	if err != nil {
		return OneRequester{}, err
	}
	one := w
	one.Count, one.Concurrency, one.Lead = n, 1, time.Hour
	prefix := "l" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	took, rejected, first, err := schedule(ctx, []*conn{p}, one, sendMode{}, prefix, time.Now(), nil)
	// Cancel every one, also after a failure or an interrupt (ctx done):
	// none may fire in an hour, nor stay stored.
	for i := range n {
		for try := 0; try < 3; try++ {
			cctx, cancel := context.WithTimeout(context.Background(), w.Timeout)
			_, cerr := p.delayd.Cancel(cctx, prefix+strconv.Itoa(i))
			cancel()
			if !errors.Is(cerr, client.ErrUnavailable) && !errors.Is(cerr, client.ErrOutcomeUnknown) {
				break
			}
		}
	}
	if err != nil {
		return OneRequester{}, err
	}
	if rejected > 0 {
		return OneRequester{}, fmt.Errorf("%d of %d one-requester schedules failed, first: %s", rejected, n, first)
	}
	return OneRequester{Calls: n, Us: us(took, n), EchoUs: echo}, nil
}

// schedulesOneRequester times n JetStream message schedules published in a
// row, each waiting for its PubAck, into the bench stream (due in an hour;
// the stream is deleted afterwards).
func schedulesOneRequester(ctx context.Context, p *conn, w Workload, n int) (OneRequester, error) {
	echo, err := oneEcho(ctx, p, w, n)
	if err != nil {
		return OneRequester{}, err
	}
	payload := payloadOf(w.PayloadSize)
	at := time.Now().Add(time.Hour)
	start := time.Now()
	for i := range n {
		pctx, cancel := context.WithTimeout(ctx, w.Timeout)
		err := p.publishSync(pctx, outgoing{Subject: "bench.sched.in.one." + strconv.Itoa(i),
			Header: scheduleHeaders(at, "bench.sched.out.one."+strconv.Itoa(i)), Data: payload})
		cancel()
		if err != nil {
			return OneRequester{}, err
		}
	}
	return OneRequester{Calls: n, Us: us(time.Since(start), n), EchoUs: echo}, nil
}

func us(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }
