// Package admin is delayd's operator surface over HTTP: liveness and
// readiness probes and Prometheus metrics.
package admin

import (
	"context"
	"runtime"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// Metrics are delayd's Prometheus metrics. They implement the observers
// the scanner and the intake declare.
type Metrics struct {
	Registry       *prometheus.Registry
	received       *prometheus.CounterVec
	delivered      *prometheus.CounterVec
	lateness       prometheus.Histogram
	claimDuration  prometheus.Histogram
	redisErrors    prometheus.Counter
	natsReconnects prometheus.Counter
	deadTotal      prometheus.Counter
	pending        prometheus.Gauge
	inflight       prometheus.Gauge
	dead           prometheus.Gauge
	oldestOverdue  prometheus.Gauge
	shardsOwned    prometheus.Gauge
	inconsistent   *prometheus.CounterVec
	recent         recent
}

// NewMetrics registers every metric, plus the Go and process collectors.
func NewMetrics(version string) *Metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{
		Registry: reg,
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delayd_envelopes_received_total",
			Help: "Schedule requests by result: stored, bad_request, forbidden, too_large, unavailable."}, []string{"result"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delayd_envelopes_delivered_total",
			Help: "Delivery attempts by result: ok (publish confirmed) or failed (will retry)."}, []string{"result"}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delayd_delivery_lateness_seconds",
			Help:    "Time from due to confirmed publish, per delivery.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5, 30, 300}}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delayd_claim_duration_seconds",
			Help:    "Duration of one claim round trip (all due shards in one pipeline).",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .05, .1, .5, 1}}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_redis_errors_total",
			Help: "Failed Redis calls (schedule, cancel, claim, ack, reap)."}),
		natsReconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_nats_reconnects_total",
			Help: "NATS reconnections."}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_envelopes_dead_total",
			Help: "Envelopes moved to the dead set after max attempts."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "delayd_pending_envelopes",
			Help: "Envelopes waiting to fall due in the shards this daemon owns (sampled; sum over daemons)."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "delayd_inflight_envelopes",
			Help: "Envelopes claimed and not yet acknowledged in the shards this daemon owns (sampled)."}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{Name: "delayd_dead_envelopes",
			Help: "Envelopes in the dead set of the shards this daemon owns (sampled)."}),
		oldestOverdue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "delayd_oldest_overdue_seconds",
			Help: "How far past due the earliest pending envelope of the owned shards is; 0 when none is (sampled)."}),
		shardsOwned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "delayd_shards_owned",
			Help: "Shards this daemon scans."}),
		inconsistent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delayd_inconsistencies_found_total",
			Help: "Entries breaking the store's invariants, found by the background check, by kind (should stay 0)."}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.received, m.delivered, m.lateness, m.claimDuration, m.redisErrors,
		m.natsReconnects, m.deadTotal, m.pending, m.inflight, m.dead, m.oldestOverdue, m.shardsOwned, m.inconsistent,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_build_info",
		Help: "Always 1; labels carry the build."}, []string{"version", "goversion"})
	f(build)
	build.WithLabelValues(version, runtime.Version()).Set(1)
	for _, r := range []string{"stored", "bad_request", "forbidden", "too_large", "unavailable"} {
		m.received.WithLabelValues(r)
	}
	m.delivered.WithLabelValues("ok")
	m.delivered.WithLabelValues("failed")
	return m
}

// Received counts one schedule request by its protocol code (0 = stored).
func (m *Metrics) Received(code int) {
	m.received.WithLabelValues(resultOf(code)).Inc()
}

// Inconsistent counts entries the background check found breaking the
// store's invariants.
func (m *Metrics) Inconsistent(kind string, n int) {
	m.inconsistent.WithLabelValues(kind).Add(float64(n))
}

func resultOf(code int) string {
	switch code {
	case 0:
		return "stored"
	case envelope.CodeBadRequest:
		return "bad_request"
	case envelope.CodeForbidden:
		return "forbidden"
	case envelope.CodeTooLarge:
		return "too_large"
	case envelope.CodeUnavailable:
		return "unavailable"
	case 504:
		return "outcome_unknown"
	}
	return strconv.Itoa(code)
}

// Delivered records one delivery attempt.
func (m *Metrics) Delivered(d envelope.Delivery, err error) {
	if err != nil {
		m.delivered.WithLabelValues("failed").Inc()
		return
	}
	m.delivered.WithLabelValues("ok").Inc()
	m.lateness.Observe(time.Since(d.Due).Seconds())
	m.recent.add(d.Target, time.Now())
}

// Claimed records one claim round trip.
func (m *Metrics) Claimed(_ int, took time.Duration) { m.claimDuration.Observe(took.Seconds()) }

// Dead counts envelopes moved to the dead set.
func (m *Metrics) Dead(_, n int) { m.deadTotal.Add(float64(n)) }

// ShardsOwned sets how many shards this daemon scans.
func (m *Metrics) ShardsOwned(n int) { m.shardsOwned.Set(float64(n)) }

// RedisError counts a failed Redis call.
func (m *Metrics) RedisError() { m.redisErrors.Inc() }

// NATSReconnect counts a NATS reconnection.
func (m *Metrics) NATSReconnect() { m.natsReconnects.Inc() }

// StatsSource is where the sampled gauges come from.
type StatsSource interface {
	Stats(ctx context.Context, shards ...int) ([]store.ShardStats, int64, error)
}

// Sample refreshes the sampled gauges every interval until ctx is done,
// for the shards owned() returns: each daemon reports the shards it scans,
// so Redis load stays flat as daemons are added and the fleet's total is
// the sum over daemons. One pipeline of ZCARDs and ZRANGE 0 0 per shard:
// never a scan.
func (m *Metrics) Sample(ctx context.Context, src StatsSource, owned func() []int, every time.Duration, log hclog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		m.sampleOnce(ctx, src, owned(), log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Metrics) sampleOnce(ctx context.Context, src StatsSource, owned []int, log hclog.Logger) {
	if len(owned) == 0 {
		m.pending.Set(0)
		m.inflight.Set(0)
		m.dead.Set(0)
		m.oldestOverdue.Set(0)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	shards, nowMs, err := src.Stats(sctx, owned...)
	if err != nil {
		if ctx.Err() == nil {
			log.Debug("sampling gauges failed", "error", err)
		}
		return
	}
	var p, i, d int64
	next := int64(-1)
	for _, s := range shards {
		p, i, d = p+s.Counts.Pending, i+s.Counts.Inflight, d+s.Counts.Dead
		if s.NextDueMs >= 0 && (next < 0 || s.NextDueMs < next) {
			next = s.NextDueMs
		}
	}
	m.pending.Set(float64(p))
	m.inflight.Set(float64(i))
	m.dead.Set(float64(d))
	overdue := 0.0
	if next >= 0 && next < nowMs {
		overdue = float64(nowMs-next) / 1000
	}
	m.oldestOverdue.Set(overdue)
}

// LatenessBucket is one (non-cumulative) bucket of the lateness histogram.
type LatenessBucket struct {
	UpTo  float64 `json:"up_to_seconds"` // 0 for the open-ended last bucket
	Count uint64  `json:"count"`
}

// latenessBuckets reads the lateness histogram for the console.
func (m *Metrics) latenessBuckets() []LatenessBucket {
	fams, err := m.Registry.Gather()
	if err != nil {
		return nil
	}
	for _, f := range fams {
		if f.GetName() != "delayd_delivery_lateness_seconds" || len(f.GetMetric()) == 0 {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		var out []LatenessBucket
		var prev uint64
		for _, b := range h.GetBucket() {
			out = append(out, LatenessBucket{UpTo: b.GetUpperBound(), Count: b.GetCumulativeCount() - prev})
			prev = b.GetCumulativeCount()
		}
		return append(out, LatenessBucket{Count: h.GetSampleCount() - prev})
	}
	return nil
}
