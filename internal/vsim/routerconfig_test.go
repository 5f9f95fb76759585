package vsim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
)

// The router a real-HTTP run starts admits as the scenario says: the
// admission mode and the classes' SLOs reach it, the objectives on the
// scenario's clock (durations divided by the time scale, rates
// multiplied), as the limits' are.
func TestRouterConfig_CarriesAdmissionByPromise(t *testing.T) {
	rc := config.DefaultConfig()
	rc.Admission.Mode = scheduler.AdmitBySLO
	rc.Admission.SLO = map[string]predict.SLO{"interactive": {TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond, MinDecode: 15, OnMiss: predict.OnMissRefuse}}
	c := FromRouterConfig(rc, sim.DemoFleet())
	got := RouterConfig(c, []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}, 10)
	if got.Admission.Mode != scheduler.AdmitBySLO {
		t.Errorf("admission.mode %q, want slo", got.Admission.Mode)
	}
	want := map[string]predict.SLO{"interactive": {TTFT: 200 * time.Millisecond, TTFTPer1k: 25 * time.Millisecond, MinDecode: 150, OnMiss: predict.OnMissRefuse}}
	if diff := cmp.Diff(want, got.Admission.SLO); diff != "" {
		t.Errorf("admission.slo (-want +got):\n%s", diff)
	}
	if def := RouterConfig(DefaultConfig(sim.DemoFleet()), []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}, 1); def.Admission.Mode != scheduler.AdmitByLimits {
		t.Errorf("default admission.mode %q, want limits", def.Admission.Mode)
	}
}

// The sessions settings reach the router a real-HTTP run starts.
func TestRouterConfig_CarriesAffinity(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}
	rc := config.DefaultConfig()
	rc.Admission.FairShareBy = config.FairShareBySession
	rc.Sessions.Affinity = false
	got := RouterConfig(FromRouterConfig(rc, sim.DemoFleet()), urls, 10)
	if got.Sessions.Affinity || got.Admission.FairShareBy != config.FairShareBySession {
		t.Errorf("sessions.affinity %v, fair_share_by %q: want false, session", got.Sessions.Affinity, got.Admission.FairShareBy)
	}
	if def := RouterConfig(DefaultConfig(sim.DemoFleet()), urls, 1); !def.Sessions.Affinity {
		t.Error("default: sessions.affinity off, want on")
	}
}
