package admin

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/delayd/delayd/internal/flow"
)

// UIFlow is what the console reads and changes of flow control
// (flow.Control).
type UIFlow interface {
	SetLimit(ctx context.Context, pattern, rate string, burst int) (flow.Status, error)
	RemoveLimit(ctx context.Context, pattern string) (bool, int, error)
	Pause(ctx context.Context, pattern string) (flow.Status, error)
	Resume(ctx context.Context, pattern string) (bool, int, error)
	Statuses(ctx context.Context) ([]flow.Status, error)
}

// flowView is one pattern's flow control as the console shows it, in the
// field names of the operator endpoints (client.FlowRule).
type flowView struct {
	Pattern     string `json:"pattern"`
	Rate        string `json:"rate,omitempty"`
	Burst       int    `json:"burst,omitempty"`
	PausedSince string `json:"paused_since,omitempty"`
	Limited     int64  `json:"limited"`
	Parked      int64  `json:"parked"`
	// DrainSeconds is null while a pause holds parked envelopes: they
	// wait for a resume, not for a limit.
	DrainSeconds *float64 `json:"drain_seconds"`
	CurrentRate  int64    `json:"current_rate"`
}

func newFlowView(st flow.Status) flowView {
	v := flowView{Pattern: st.Pattern, Rate: st.Rate, Burst: st.Burst, Limited: st.Limited, Parked: st.Parked, CurrentRate: st.FlowHeld.Rate}
	if !st.PausedSince.IsZero() {
		v.PausedSince = consoleTime(st.PausedSince.UnixMilli())
	}
	if d := st.Drain(); d != math.MaxInt64 {
		secs := d.Seconds()
		v.DrainSeconds = &secs
	}
	return v
}

// flowTimeout bounds one change, as on the operator endpoints: a resume
// releases its parked envelopes a thousand a round trip.
const flowTimeout = 30 * time.Second

func (u *UI) flowRules(w http.ResponseWriter, r *http.Request) {
	if u.opt.Flow == nil {
		writeJSON(w, map[string]any{"available": false, "rules": []flowView{}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	sts, err := u.opt.Flow.Statuses(ctx)
	if err != nil {
		u.unavailable(w, err)
		return
	}
	rules := make([]flowView, len(sts))
	for i, st := range sts {
		rules[i] = newFlowView(st)
	}
	writeJSON(w, map[string]any{"available": true, "rules": rules})
}

// limit sets a rate limit, or removes it (rate "off").
func (u *UI) limit(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Pattern string `json:"pattern"`
		Rate    string `json:"rate"`
		Burst   int    `json:"burst"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Pattern == "" || req.Rate == "" {
		http.Error(w, `body must be {"pattern": "orders.>", "rate": "500/s", "burst": 50} or {"pattern": "orders.>", "rate": "off"}`, http.StatusBadRequest)
		return
	}
	if !u.flowOn(w) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), flowTimeout)
	defer cancel()
	if req.Rate == "off" {
		existed, released, err := u.opt.Flow.RemoveLimit(ctx, req.Pattern)
		if u.flowFailed(w, err) {
			return
		}
		u.log.Info("rate limit removed from the console", "pattern", req.Pattern, "existed", existed, "released", released)
		writeJSON(w, map[string]any{"pattern": req.Pattern, "existed": existed, "released": released})
		return
	}
	st, err := u.opt.Flow.SetLimit(ctx, req.Pattern, req.Rate, req.Burst)
	if u.flowFailed(w, err) {
		return
	}
	u.log.Info("rate limit set from the console", "pattern", req.Pattern, "rate", st.Rate, "burst", st.Burst)
	writeJSON(w, map[string]any{"rule": newFlowView(st)})
}

// pause serves pause, or resume.
func (u *UI) pause(resume bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Pattern string `json:"pattern"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Pattern == "" {
			http.Error(w, `body must be {"pattern": "orders.>"}`, http.StatusBadRequest)
			return
		}
		if !u.flowOn(w) {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), flowTimeout)
		defer cancel()
		if resume {
			existed, released, err := u.opt.Flow.Resume(ctx, req.Pattern)
			if u.flowFailed(w, err) {
				return
			}
			u.log.Info("pause ended from the console", "pattern", req.Pattern, "was_paused", existed, "released", released)
			writeJSON(w, map[string]any{"pattern": req.Pattern, "existed": existed, "released": released})
			return
		}
		st, err := u.opt.Flow.Pause(ctx, req.Pattern)
		if u.flowFailed(w, err) {
			return
		}
		u.log.Info("paused from the console", "pattern", req.Pattern, "since", st.PausedSince)
		writeJSON(w, map[string]any{"rule": newFlowView(st)})
	}
}

func (u *UI) flowOn(w http.ResponseWriter) bool {
	if u.opt.Flow == nil {
		http.Error(w, "flow control is not available in this daemon", http.StatusNotFound)
	}
	return u.opt.Flow != nil
}

// flowFailed answers a refused rule with why (400), and Redis failing
// with 503.
func (u *UI) flowFailed(w http.ResponseWriter, err error) bool {
	switch {
	case errors.Is(err, flow.ErrBadRule):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case err != nil:
		u.unavailable(w, err)
	}
	return err != nil
}
