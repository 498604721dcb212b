package bench

import (
	"fmt"
	"io"
	"strings"
)

// label names a result's mode, with its batch size.
func label(r Result) string {
	switch r.Mode {
	case ModeBatch:
		return fmt.Sprintf("batches of %d", r.Batch)
	case ModeClientBatching:
		return fmt.Sprintf("client batching ≤%d", r.Batch)
	}
	return r.Mode
}

// Print writes the result as a table and a lateness histogram.
func Print(w io.Writer, r Result) {
	fmt.Fprintf(w, "\nworkload   %d envelopes, %d requesters, %d-byte payloads, %.0f due/s\n",
		r.Count, r.Concurrency, r.PayloadBytes, r.DueRate)
	switch r.Mode {
	case ModeStream:
		fmt.Fprintf(w, "intake     %.0f envelopes/s publish to pending in Redis (%.2f s); PubAcks %.0f/s", r.IntakeRate, r.IntakeSeconds, r.PubAckRate)
		if r.BaselineRate > 0 {
			fmt.Fprintf(w, "; baseline (stream nobody consumes) %.0f/s; ratio %.0f%%", r.BaselineRate, 100*r.IntakeRatio)
		}
	case ModeBatch, ModeClientBatching:
		fmt.Fprintf(w, "intake     %.0f envelopes/s acknowledged, %s (%.2f s)", r.IntakeRate, label(r), r.IntakeSeconds)
		if r.BaselineRate > 0 {
			fmt.Fprintf(w, "; baseline (echo, one message a request) %.0f req/s; ratio %.0f%%", r.BaselineRate, 100*r.IntakeRatio)
		}
	default:
		fmt.Fprintf(w, "intake     %.0f schedules/s acknowledged (%.2f s)", r.IntakeRate, r.IntakeSeconds)
		if r.BaselineRate > 0 {
			fmt.Fprintf(w, "; baseline %.0f req/s; ratio %.0f%%", r.BaselineRate, 100*r.IntakeRatio)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "delivered  %d   lost %d   duplicates %d   early %d   rejected %d\n",
		r.Delivered, r.Lost, r.Duplicates, r.Early, r.Rejected)
	if r.FirstRejection != "" {
		fmt.Fprintf(w, "           first rejection: %s\n", r.FirstRejection)
	}
	q := r.LatenessMs
	fmt.Fprintf(w, "lateness   p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms\n", q.P50, q.P90, q.P99, q.Max)
	if r.Daemon != nil {
		fmt.Fprintf(w, "delayd     %.2f CPU s   peak RSS %.1f MiB\n", r.Daemon.CPUSeconds, r.Daemon.PeakRSSMiB)
	}
	if r.Redis != nil {
		fmt.Fprintf(w, "redis      %.1f CPU µs per schedule   %.1f CPU µs per delivery (main thread)\n",
			r.Redis.CPUMicrosPerSchedule, r.Redis.CPUMicrosPerDelivery)
	}
	printSplit(w, "cpu base", r.BaselineCPU, "message")
	if r.CPU != nil {
		printSplit(w, "cpu intake", r.CPU.Intake, "envelope")
		printSplit(w, "cpu deliv", r.CPU.Delivery, "delivery")
	}
	fmt.Fprintln(w, "\nlateness histogram")
	maxCount := 0
	for _, b := range r.Histogram {
		maxCount = max(maxCount, b.Count)
	}
	prev := "0"
	for _, b := range r.Histogram {
		label := fmt.Sprintf("%s–%g ms", prev, b.UpToMs)
		if b.UpToMs < 0 {
			label = "≥ " + prev + " ms"
		}
		prev = fmt.Sprintf("%g", b.UpToMs)
		bar := 0
		if maxCount > 0 {
			bar = b.Count * 50 / maxCount
			if b.Count > 0 && bar == 0 {
				bar = 1
			}
		}
		fmt.Fprintf(w, "  %-14s %8d %s\n", label, b.Count, strings.Repeat("█", bar))
	}
}
