package outlen

import (
	"fmt"
	"testing"
)

// An estimate comes from the most specific level with enough samples:
// the tenant's bucket of prompt sizes, the tenant, the model, else the
// default; max_tokens caps it.
func TestEstimator_LearnsAndFallsBack(t *testing.T) {
	e := Estimator{Default: 256}
	est := func(r Request) string {
		out, src := e.Estimate(r)
		return fmt.Sprintf("%.0f %s", out, src)
	}
	small := Request{Model: "m", Tenant: "t", PromptTokens: 100}
	if got, want := est(small), "256 default"; got != want {
		t.Fatalf("before any sample: %s, want %s", got, want)
	}
	e.Observe(Request{Model: "m", Tenant: "other", PromptTokens: 100}, 40)
	if got, want := est(small), "40 model"; got != want {
		t.Fatalf("after another tenant's sample: %s, want %s", got, want)
	}
	for range 3 {
		e.Observe(Request{Model: "m", Tenant: "t", PromptTokens: 120}, 10) // same bucket as 100: 64..127
	}
	if got, want := est(small), "10 bucket"; got != want {
		t.Fatalf("after 3 samples in the bucket: %s, want %s", got, want)
	}
	large := Request{Model: "m", Tenant: "t", PromptTokens: 5000}
	if got, want := est(large), "10 tenant"; got != want {
		t.Fatalf("another bucket: %s, want %s", got, want)
	}
	capped := Request{Model: "m", Tenant: "new", MaxTokens: 5}
	if got, want := est(capped), "5 max_tokens"; got != want {
		t.Fatalf("capped: %s, want %s", got, want)
	}
	if got, want := est(Request{Model: "unseen"}), "256 default"; got != want {
		t.Fatalf("unseen model: %s, want %s", got, want)
	}
}
