package intake

// The operator endpoints of flow control: limit, limits, pause, resume
// (docs/operations.md, "Flow control").

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
)

// FlowControl makes the operator's flow-control changes (flow.Control).
type FlowControl interface {
	SetLimit(ctx context.Context, pattern, rate string, burst int) (flow.Status, error)
	RemoveLimit(ctx context.Context, pattern string) (bool, int, error)
	Pause(ctx context.Context, pattern string) (flow.Status, error)
	Resume(ctx context.Context, pattern string) (bool, int, error)
	Statuses(ctx context.Context) ([]flow.Status, error)
}

// flowTimeout bounds one change: a resume releases its parked envelopes a
// thousand a round trip. One cut short is finished by the daemons (the
// pause's parked marker stays until its ledger is empty).
const flowTimeout = 30 * time.Second

func (in *Intake) addFlow(g micro.Group) error {
	if in.opt.Flow == nil {
		return nil
	}
	for name, h := range map[string]micro.HandlerFunc{
		"limit": in.handleLimit, "limits": in.handleLimits, "pause": in.handlePause(false), "resume": in.handlePause(true),
	} {
		if err := g.AddEndpoint(name, h); err != nil {
			return err
		}
	}
	return nil
}

func (in *Intake) handleLimit(req micro.Request) {
	var r client.LimitRequest
	if err := json.Unmarshal(req.Data(), &r); err != nil || r.Pattern == "" || r.Rate == "" {
		in.fail(now(req), envelope.CodeBadRequest, `limit body must be {"pattern": "orders.>", "rate": "500/s", "burst": 50} or {"pattern": "orders.>", "rate": "off"}`)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	var out client.FlowChange
	var err error
	if r.Rate == "off" {
		out.Existed, out.Released, err = in.opt.Flow.RemoveLimit(ctx, r.Pattern)
		out.Rule = client.FlowRule{Pattern: r.Pattern}
		if err == nil {
			in.log.Info("rate limit removed", "pattern", r.Pattern, "existed", out.Existed, "released", out.Released)
		}
	} else {
		var st flow.Status
		st, err = in.opt.Flow.SetLimit(ctx, r.Pattern, r.Rate, r.Burst)
		out.Rule = flowRule(st)
		if err == nil {
			in.log.Info("rate limit set", "pattern", r.Pattern, "rate", r.Rate, "burst", st.Burst)
		}
	}
	in.flowAnswer(req, "limit", out, err)
}

// handlePause serves pause, or resume.
func (in *Intake) handlePause(resume bool) micro.HandlerFunc {
	verb := map[bool]string{false: "pause", true: "resume"}[resume]
	return func(req micro.Request) {
		var r struct {
			Pattern string `json:"pattern"`
		}
		if err := json.Unmarshal(req.Data(), &r); err != nil || r.Pattern == "" {
			in.fail(now(req), envelope.CodeBadRequest, verb+` body must be {"pattern": "orders.>"}`)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
		defer cancel()
		var out client.FlowChange
		var err error
		if resume {
			out.Existed, out.Released, err = in.opt.Flow.Resume(ctx, r.Pattern)
			out.Rule = client.FlowRule{Pattern: r.Pattern}
			if err == nil {
				in.log.Info("pause ended", "pattern", r.Pattern, "was_paused", out.Existed, "released", out.Released)
			}
		} else {
			var st flow.Status
			st, err = in.opt.Flow.Pause(ctx, r.Pattern)
			out.Rule = flowRule(st)
			if err == nil {
				in.log.Info("paused", "pattern", r.Pattern, "since", st.PausedSince)
			}
		}
		in.flowAnswer(req, verb, out, err)
	}
}

func (in *Intake) flowAnswer(req micro.Request, verb string, out client.FlowChange, err error) {
	switch {
	case errors.Is(err, flow.ErrBadRule):
		in.fail(now(req), envelope.CodeBadRequest, err.Error())
	case err != nil:
		in.log.Error(verb+" failed", "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
	default:
		in.respond(now(req), out)
	}
}

func (in *Intake) handleLimits(req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), in.opt.storeTimeout)
	defer cancel()
	rules, err := in.flowRules(ctx)
	if err != nil {
		in.log.Error("limits failed", "error", err)
		in.fail(now(req), envelope.CodeUnavailable, "store unavailable")
		return
	}
	in.respond(now(req), rules)
}

// flowRules reads every rule as the client sees it.
func (in *Intake) flowRules(ctx context.Context) ([]client.FlowRule, error) {
	if in.opt.Flow == nil {
		return nil, nil
	}
	sts, err := in.opt.Flow.Statuses(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]client.FlowRule, len(sts))
	for i, st := range sts {
		out[i] = flowRule(st)
	}
	return out, nil
}

func flowRule(st flow.Status) client.FlowRule {
	r := client.FlowRule{Pattern: st.Pattern, Rate: st.Rate, Burst: st.Burst, Limited: st.Limited, Parked: st.Parked,
		DrainSeconds: float64(st.BacklogMs) / 1000, CurrentRate: st.FlowHeld.Rate}
	if !st.PausedSince.IsZero() {
		r.PausedSince = envelope.FormatMs(st.PausedSince.UnixMilli())
	}
	return r
}
