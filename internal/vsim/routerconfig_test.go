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

// The learning controller's durations and the queue's aging bound, which
// are not configuration keys, reach the router a real-HTTP run starts on
// the scenario's clock (divided by the time scale), and fixed limits
// reach it as they are.
func TestRouterConfig_ScalesWhatIsNotAKey(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}
	c := DefaultConfig(sim.DemoFleet())
	c.Concurrency.Fixed = true
	got := RouterConfig(c, urls, 10)
	lc := got.Limits.Scheduler()
	if !lc.Fixed || lc.ProbeAfter != 6*time.Second || lc.BorrowAfter != 200*time.Millisecond || lc.MinSamples != 3 || lc.DefaultCap != 64 {
		t.Errorf("limits %+v: want fixed, probe after 6s, borrow after 200ms, 3 samples, cap 64", lc)
	}
	if got.Admission.MaxOvertake != time.Second {
		t.Errorf("aging bound %v, want 1s (10s at time scale 10)", got.Admission.MaxOvertake)
	}
	if def := RouterConfig(DefaultConfig(sim.DemoFleet()), urls, 1).Limits.Scheduler(); def.Fixed {
		t.Error("default: fixed limits, want learned")
	}
}
