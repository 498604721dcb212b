package systest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// TestMicroStatsCountErrors: `nats micro stats delayd` counts refused
// requests (they once showed Errors 0 after 56 refused schedules), and a
// schedule's store failure, answered after its handler returned, shows in
// the endpoint's data as late_errors.
func TestMicroStatsCountErrors(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.HTTP.Addr = ""
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	for range 5 {
		rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Delay", "1s"), "no target")
		if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "400" {
			t.Fatalf("want 400, got %v %v", rep, err)
		}
	}
	if _, err := nc.RequestMsg(&nats.Msg{Subject: "delayd.cancel", Header: nats.Header{}}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	e.Redis.Kill()
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "a.b", "Delayd-Delay", "1s"), "x")
	if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Fatalf("with Redis down want 503, got %v %v", rep, err)
	}
	m, err := nc.Request("$SRV.STATS.delayd", nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatal(err)
	}
	got := map[string]*micro.EndpointStats{}
	for _, ep := range stats.Endpoints {
		got[ep.Name] = ep
	}
	sch, can := got["schedule"], got["cancel"]
	if sch == nil || can == nil {
		t.Fatalf("endpoints %v", stats.Endpoints)
	}
	if sch.NumErrors != 5 || sch.LastError == "" || can.NumErrors != 1 {
		t.Fatalf("schedule num_errors %d (%q), cancel %d: want 5 and 1", sch.NumErrors, sch.LastError, can.NumErrors)
	}
	var data struct {
		LateErrors    int    `json:"late_errors"`
		LastLateError string `json:"last_late_error"`
	}
	if err := json.Unmarshal(sch.Data, &data); err != nil || data.LateErrors != 1 || data.LastLateError == "" {
		t.Fatalf("schedule data %s: want late_errors 1", sch.Data)
	}
}
