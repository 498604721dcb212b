// Package admin is delayd's operator surface over HTTP: liveness and
// readiness probes and Prometheus metrics.
package admin

import (
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/store"
)

// Metrics are delayd's Prometheus metrics. They implement the observers
// the scanner and the intake declare.
type Metrics struct {
	Registry       *prometheus.Registry
	received       *prometheus.CounterVec
	streamIntake   *prometheus.CounterVec
	delivered      *prometheus.CounterVec
	cancels        *prometheus.CounterVec
	redeliveries   *prometheus.CounterVec
	lateness       prometheus.Histogram
	claimDuration  prometheus.Histogram
	intakeDuration prometheus.Histogram
	redisErrors    *prometheus.CounterVec
	waitDuration   *prometheus.HistogramVec
	waitShort      *prometheus.CounterVec
	natsReconnects prometheus.Counter
	deadTotal      prometheus.Counter
	purged         prometheus.Counter
	unknownFormat  *prometheus.CounterVec
	pending        prometheus.Gauge
	inflight       prometheus.Gauge
	dead           prometheus.Gauge
	oldestOverdue  prometheus.Gauge
	shardsOwned    prometheus.Gauge
	inconsistent   *prometheus.CounterVec
	shardsTotal    prometheus.Gauge
	redisConnected prometheus.Gauge
	// The fleet-wide gauges cover every shard and are exported only by
	// the reporter (the daemon that owns shard 0), so Redis load stays flat
	// as daemons are added and a query needs no de-duplication.
	backlog        *prometheus.GaugeVec
	backlogOverdue *prometheus.GaugeVec
	shardsUnowned  *prometheus.GaugeVec
	recent         recent
	// Flow control (flow.Observer, and the fleet-wide gauges the
	// reporter samples from WatchFlow's source).
	flowHolds   *prometheus.CounterVec
	flowWait    *prometheus.HistogramVec
	flowHeld    *prometheus.GaugeVec
	flowBacklog *prometheus.GaugeVec
	flowRate    *prometheus.GaugeVec
	flowPaused  *prometheus.GaugeVec
	flowSource  func() []flow.Status
	flowSet     map[flowSeries]bool // the series the last sample set
}

// opSample labels the failed Redis calls of the gauges' sampling (sample.go).
const opSample = "sample"

// Label values, created up front so every series exists from the start.
var (
	receivedResults  = []string{"stored", "bad_request", "forbidden", "too_large", "unavailable", "outcome_unknown"}
	streamResults    = []string{"stored", "redelivered", "bad_request", "forbidden", "too_large", "unavailable"}
	cancelResults    = []string{"cancelled", "not_found", "bad_request", "unavailable", "outcome_unknown"}
	redeliveryCauses = []string{"lease_expiry", "retry", "replay"}
	redisOps         = []string{store.OpSchedule, store.OpCancel, store.OpClaim, store.OpAck, opSample}
	intakeBuckets    = []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5}
	latenessBucketsS = []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5, 30, 300}
	claimBucketsS    = []float64{.0002, .0005, .001, .002, .005, .01, .05, .1, .5, 1}
	waitOps          = store.WaitOps()
	waitBucketsS     = []float64{.0001, .0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2, 4}
)

// NewMetrics registers every metric, plus the Go and process collectors.
// version and mode (config mode: all, intake or scanner) label
// delayd_build_info, so alerts can count the daemons that scan.
func NewMetrics(version, mode string) *Metrics {
	reg := prometheus.NewRegistry()
	counterVec := func(name, help string, label string, values []string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
		for _, l := range values {
			v.WithLabelValues(l)
		}
		return v
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &Metrics{
		Registry: reg,
		received: counterVec("delayd_envelopes_received_total",
			"Schedule requests by result: stored, bad_request, forbidden, too_large, unavailable (503: nothing written), outcome_unknown (504: Redis may have stored it, or redis.wait_replicas was not confirmed; the reply carries the id to retry with).", "result", receivedResults),
		streamIntake: counterVec("delayd_stream_intake_total",
			"Messages taken from the intake stream by result: stored (acknowledged), redelivered (a redelivery of a message stored already, after its ack was lost: acknowledged, not stored again), bad_request, forbidden, too_large (terminated, published to <subject>.rejected), unavailable (Redis failed; left in the stream).",
			"result", streamResults),
		delivered: counterVec("delayd_envelopes_delivered_total",
			"Delivery attempts by result: ok (publish confirmed), no_interest (a core NATS delivery that reached no subscriber: retried with backoff) or failed (will retry).",
			"result", []string{"ok", "failed", "no_interest"}),
		cancels: counterVec("delayd_cancels_total",
			"Cancel requests by result: cancelled, not_found, bad_request, unavailable (503), outcome_unknown (504: the cancel may have happened).", "result", cancelResults),
		redeliveries: counterVec("delayd_redeliveries_total",
			"Envelopes set to be delivered again, by cause: lease_expiry (re-claimed after its lease expired), retry (publish failed), replay (from the dead set).",
			"cause", redeliveryCauses),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delayd_delivery_lateness_seconds",
			Help: "Time from due to confirmed publish, per delivery; for a Delayd-At more than 1 s in the past when accepted, from its acceptance.", Buckets: latenessBucketsS}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delayd_claim_duration_seconds",
			Help: "Duration of one claim round trip (all due shards in one pipeline).", Buckets: claimBucketsS}),
		intakeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "delayd_intake_duration_seconds",
			Help:    "Schedule requests that reached Redis: time from request received to reply sent.",
			Buckets: intakeBuckets}),
		redisErrors: counterVec("delayd_redis_errors_total",
			"Failed Redis calls by operation: schedule, cancel, claim, ack, sample.", "op", redisOps),
		waitDuration: func() *prometheus.HistogramVec {
			v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delayd_redis_wait_seconds",
				Help:    "With redis.wait_replicas or wait_local_fsync: how long each WAIT blocked in Redis (one per pipeline and master), by operation: schedule, cancel, claim.",
				Buckets: waitBucketsS}, []string{"op"})
			for _, op := range waitOps {
				v.WithLabelValues(op)
			}
			return v
		}(),
		waitShort: counterVec("delayd_redis_wait_short_total",
			"WAITs that fell short (fewer replicas than redis.wait_replicas, or no fsync, within redis.wait_timeout), by operation: schedule and cancel answered 504, claim published anyway (idle claims count too).",
			"op", waitOps),
		natsReconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_nats_reconnects_total",
			Help: "NATS reconnections."}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_envelopes_dead_total",
			Help: "Envelopes moved to the dead set after max attempts, as the store confirmed. Summed over the fleet, minus delayd_envelopes_purged_total and delayd_redeliveries_total{cause=\"replay\"}, it equals delayd_dead_envelopes (less dead envelopes cancelled or replaced by id)."}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{Name: "delayd_envelopes_purged_total",
			Help: "Dead envelopes deleted by a purge (NATS admin endpoint or console)."}),
		unknownFormat: counterVec("delayd_unknown_format_total",
			"Stored values of a format newer than this daemon reads, met by a claim and left for a daemon that reads it, by format (upgrade this daemon).",
			"format", []string{"3"}),
		pending: gauge("delayd_pending_envelopes",
			"Envelopes waiting to fall due in the shards this daemon owns (sampled; sum over daemons)."),
		inflight: gauge("delayd_inflight_envelopes",
			"Envelopes claimed and not yet acknowledged in the shards this daemon owns (sampled)."),
		dead: gauge("delayd_dead_envelopes",
			"Envelopes in the dead set of the shards this daemon owns (sampled)."),
		oldestOverdue: gauge("delayd_oldest_overdue_seconds",
			"How far past due the earliest pending envelope of the owned shards is; 0 when none is (sampled)."),
		shardsOwned: gauge("delayd_shards_owned", "Shards this daemon scans."),
		shardsTotal: gauge("delayd_shards", "Shards of the delay set (config shards). Named delayd_shards_total before 0.2."),
		redisConnected: gauge("delayd_redis_connected",
			"1 when the last sampling call to Redis succeeded, else 0."),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_backlog_envelopes",
			Help: "Envelopes in every shard, owned or not, by state (sampled; exported only by the owner of shard 0)."},
			[]string{"state"}),
		backlogOverdue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_backlog_oldest_overdue_seconds",
			Help: "How far past due the earliest pending envelope of any shard is (sampled; exported only by the owner of shard 0)."},
			nil),
		shardsUnowned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_shards_unowned",
			Help: "Shards no daemon holds the lease of (sampled; exported only by the owner of shard 0)."}, nil),
		inconsistent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delayd_inconsistencies_found_total",
			Help: "Entries breaking the store's invariants, found by the background check, by kind (should stay 0)."}, []string{"kind"}),
		flowHolds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "delayd_flow_holds_total",
			Help: "Holds of claimed envelopes by flow control, not sent and not an attempt, by rule pattern and reason: limit (due again at its slot; one moved on behind late deliveries is held twice) or pause (parked until the resume)."},
			[]string{"pattern", "reason"}),
		flowWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "delayd_flow_limit_wait_seconds",
			Help:    "Per delivery under a rate limit, by its pattern: the lateness the limit caused (from due to its slot). delayd_delivery_lateness_seconds counts from the slot.",
			Buckets: latenessBucketsS}, []string{"pattern"}),
		flowHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_flow_held_envelopes",
			Help: "Envelopes a rule holds now, by pattern and reason: limit (waiting for their slot) or pause (parked) (sampled; exported only by the owner of shard 0)."},
			[]string{"pattern", "reason"}),
		flowBacklog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_flow_drain_seconds",
			Help: "How long a rule's held envelopes take to go out: until the last slot its limit gave, +Inf while paused with envelopes parked (sampled; exported only by the owner of shard 0)."},
			[]string{"pattern"}),
		flowRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_flow_rate",
			Help: "Deliveries a rate limit let go in the last whole second, fleet-wide, by pattern (sampled; exported only by the owner of shard 0)."},
			[]string{"pattern"}),
		flowPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_flow_paused_seconds",
			Help: "How long a pattern has been paused, by pattern; absent when not paused (sampled; exported only by the owner of shard 0)."},
			[]string{"pattern"}),
	}
	for _, c := range []prometheus.Collector{m.received, m.streamIntake, m.delivered, m.cancels, m.redeliveries, m.lateness,
		m.claimDuration, m.intakeDuration, m.redisErrors, m.waitDuration, m.waitShort, m.natsReconnects, m.deadTotal, m.purged, m.unknownFormat, m.pending, m.inflight,
		m.dead, m.oldestOverdue, m.shardsOwned, m.shardsTotal, m.redisConnected, m.backlog, m.backlogOverdue,
		m.shardsUnowned, m.inconsistent, m.flowHolds, m.flowWait, m.flowHeld, m.flowBacklog, m.flowRate, m.flowPaused, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		reg.MustRegister(c)
	}
	for _, k := range store.AllKinds {
		m.inconsistent.WithLabelValues(k) // exported at 0 from the start
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "delayd_build_info",
		Help: "Always 1; labels carry the build and the daemon's mode (all, intake, scanner: only all and scanner own shards)."},
		[]string{"version", "goversion", "mode"})
	reg.MustRegister(build)
	build.WithLabelValues(version, runtime.Version(), mode).Set(1)
	return m
}

// WatchNATS exports delayd_nats_connected from connected, read at scrape
// time.
func (m *Metrics) WatchNATS(connected func() bool) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "delayd_nats_connected",
		Help: "1 while every NATS connection this daemon needs is up, else 0."}, func() float64 {
		if connected() {
			return 1
		}
		return 0
	}))
}

// HeldBudgets are the byte budgets a daemon exports, each as
// delayd_<budget>_held_bytes (WatchHeld). Every one returns to 0 once the
// work is done: one that stays up while nothing comes in or falls due is
// bytes never given back, a stall in the making.
var HeldBudgets = []string{"claims", "settles", "request_intake", "stream_intake"}

var heldHelp = map[string]string{
	"claims": "Bytes of claimed envelopes not yet published (stored bytes plus 1 KiB each); with the settles' bytes " +
		"bounded by 4 x scanner.claim_bytes, no claim starts past it. 0 when idle.",
	"settles": "Bytes held by published envelopes until their settles are written (1 KiB each), within the claims' " +
		"bound. 0 when idle.",
	"request_intake": "Bytes of schedule requests taken and not yet answered, bounded by intake.pending_bytes. 0 when idle.",
	"stream_intake":  "Bytes of intake stream messages taken and not yet settled, bounded by intake.stream.pull_bytes. 0 when idle.",
}

// WatchHeld exports delayd_<budget>_held_bytes from held, read at scrape
// time; budget is one of HeldBudgets.
func (m *Metrics) WatchHeld(budget string, held func() int64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "delayd_" + budget + "_held_bytes",
		Help: heldHelp[budget]}, func() float64 { return float64(held()) }))
}

// WatchEvictionGuard exports delayd_redis_eviction_guard from state, read
// at scrape time: 1 for the guard's state (store.GuardStates), 0 for the
// others.
func (m *Metrics) WatchEvictionGuard(state func() string) {
	for _, s := range store.GuardStates {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "delayd_redis_eviction_guard",
			Help: "1 for the state of the guard against an evicting Redis maxmemory-policy: on (read, noeviction), " +
				"allowed (evicts, redis.allow_eviction), skipped (Redis will not tell, redis.eviction_check: skip), " +
				"unknown (not read yet).",
			ConstLabels: prometheus.Labels{"state": s}}, func() float64 {
			if state() == s {
				return 1
			}
			return 0
		}))
	}
}

// WatchFlow makes the reporter export the fleet's flow-control rules and
// what they hold (delayd_flow_*), from statuses, read at each sample.
func (m *Metrics) WatchFlow(statuses func() []flow.Status) { m.flowSource = statuses }

// Held counts n envelopes held back by the rule on pattern (flow.Observer).
func (m *Metrics) Held(pattern, reason string, n int) {
	m.flowHolds.WithLabelValues(label(pattern), reason).Add(float64(n))
}

// Allowed records a delivery a limit let go, waited after its due time
// (flow.Observer).
func (m *Metrics) Allowed(pattern string, waited time.Duration) {
	m.flowWait.WithLabelValues(label(pattern)).Observe(waited.Seconds())
}

// label makes a pattern a label value Prometheus takes: one not UTF-8
// (the rules refuse those, but a panic here would stop the daemon) gets
// U+FFFD for its bad bytes.
func label(pattern string) string { return strings.ToValidUTF8(pattern, "\uFFFD") }

// sampleFlow sets the fleet-wide flow gauges (the reporter's), or clears
// them. A series is deleted only after the new ones are set, and only if
// this sample did not set it again: a scrape between a Reset and the Sets
// would see no flow metrics at all (CI caught the dashboard test doing so).
func (m *Metrics) sampleFlow(reporter bool) {
	now := map[flowSeries]bool{}
	set := func(v *prometheus.GaugeVec, x float64, labels ...string) {
		labels[0] = label(labels[0])
		v.WithLabelValues(labels...).Set(x)
		now[flowSeries{v, strings.Join(labels, "\x00")}] = true
	}
	if reporter && m.flowSource != nil {
		for _, st := range m.flowSource() {
			if st.Rate != "" {
				set(m.flowHeld, float64(st.Limited), st.Pattern, "limit")
				set(m.flowRate, float64(st.FlowHeld.Rate), st.Pattern)
			}
			if !st.PausedSince.IsZero() {
				set(m.flowHeld, float64(st.Parked), st.Pattern, "pause")
				set(m.flowPaused, time.Since(st.PausedSince).Seconds(), st.Pattern)
			}
			drain := st.Drain().Seconds()
			if st.Drain() == time.Duration(math.MaxInt64) {
				drain = math.Inf(1)
			}
			set(m.flowBacklog, drain, st.Pattern)
		}
	}
	for s := range m.flowSet {
		if !now[s] {
			s.vec.DeleteLabelValues(strings.Split(s.labels, "\x00")...)
		}
	}
	m.flowSet = now
}

// flowSeries names one series of a flow gauge, to delete it once gone.
type flowSeries struct {
	vec    *prometheus.GaugeVec
	labels string
}

// Received counts one schedule request by its protocol code (0 = stored).
func (m *Metrics) Received(code int) {
	m.received.WithLabelValues(resultOf(code)).Inc()
}

// StreamIntake counts n messages taken from the intake stream by result.
func (m *Metrics) StreamIntake(result string, n int) {
	m.streamIntake.WithLabelValues(result).Add(float64(n))
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
	case 504:
		return "outcome_unknown"
	}
	// Only the codes above and 503 exist for schedule requests; anything
	// else is counted as unavailable rather than minting a new series.
	return "unavailable"
}

// Cancelled counts one cancel request by result: cancelled, not_found,
// bad_request or unavailable.
func (m *Metrics) Cancelled(result string) { m.cancels.WithLabelValues(result).Inc() }

// Replied observes the time from receiving a schedule request to sending
// its reply.
func (m *Metrics) Replied(took time.Duration) { m.intakeDuration.Observe(took.Seconds()) }

// Redelivered counts n envelopes set to be delivered again for cause:
// lease_expiry, retry or replay.
func (m *Metrics) Redelivered(cause string, n int) {
	m.redeliveries.WithLabelValues(cause).Add(float64(n))
}

// Delivered records one delivery attempt.
func (m *Metrics) Delivered(d envelope.Delivery, err error) {
	switch {
	case errors.Is(err, scanner.ErrNoInterest):
		m.delivered.WithLabelValues("no_interest").Inc()
		return
	case err != nil:
		m.delivered.WithLabelValues("failed").Inc()
		return
	}
	m.delivered.WithLabelValues("ok").Inc()
	m.lateness.Observe(time.Since(d.LateSince()).Seconds())
	m.recent.add(d.Target, time.Now())
}

// Claimed records one claim round trip.
func (m *Metrics) Claimed(_ int, took time.Duration) { m.claimDuration.Observe(took.Seconds()) }

// Dead counts envelopes moved to the dead set.
func (m *Metrics) Dead(n int) { m.deadTotal.Add(float64(n)) }

// Purged counts n dead envelopes deleted.
func (m *Metrics) Purged(n int) { m.purged.Add(float64(n)) }

// UnknownFormat counts n stored values of a format this daemon cannot
// read.
func (m *Metrics) UnknownFormat(format, n int) {
	m.unknownFormat.WithLabelValues(strconv.Itoa(format)).Add(float64(n))
}

// ShardsOwned sets how many shards this daemon scans.
func (m *Metrics) ShardsOwned(n int) { m.shardsOwned.Set(float64(n)) }

// RedisError counts a failed Redis call of operation op.
func (m *Metrics) RedisError(op string) { m.redisErrors.WithLabelValues(op).Inc() }

// Waited observes one WAIT of the store (store.WaitObserver).
func (m *Metrics) Waited(op string, took time.Duration, short bool) {
	m.waitDuration.WithLabelValues(op).Observe(took.Seconds())
	if short {
		m.waitShort.WithLabelValues(op).Inc()
	}
}

// NATSReconnect counts a NATS reconnection.
func (m *Metrics) NATSReconnect() { m.natsReconnects.Inc() }

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
