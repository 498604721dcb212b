package recur

import (
	"testing"
	"time"
)

func BenchmarkNextCron(b *testing.B) {
	r := Rule{Cron: "0 */5 * * * *", Zone: "Europe/Berlin"}
	prev := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.Next(prev, prev, 1); !ok {
			b.Fatal("no next")
		}
	}
}

func BenchmarkNextEvery(b *testing.B) {
	r := Rule{Every: time.Minute}
	prev := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.Next(prev, prev, 1); !ok {
			b.Fatal("no next")
		}
	}
}
