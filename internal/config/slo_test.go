package config

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/predict"
)

func TestParse_SLOPerClassAndKey(t *testing.T) {
	cfg, err := parse(`
workers: [{name: a, url: 'http://h:1'}]
admission:
  slo:
    interactive: {ttft: 1s, ttft_per_1k_prompt_tokens: 300ms, min_decode_tok_s: 20, on_miss: serve}
    batch: {on_miss: refuse}
auth:
  keys:
    - {key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, tenant: ide, class: interactive, slo: {ttft: 500ms}}
`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]predict.SLO{
		"interactive": {TTFT: time.Second, TTFTPer1k: 300 * time.Millisecond, MinDecode: 20, OnMiss: predict.OnMissServe},
		"batch":       {OnMiss: predict.OnMissRefuse},
	}
	if diff := cmp.Diff(want, cfg.Admission.SLO); diff != "" {
		t.Errorf("admission.slo (-want +got):\n%s", diff)
	}
	key := cfg.Auth.Keys[0].SLO
	if got, want := key.Or(cfg.Admission.SLO["interactive"]), (predict.SLO{TTFT: 500 * time.Millisecond, TTFTPer1k: 300 * time.Millisecond, MinDecode: 20, OnMiss: predict.OnMissServe}); got != want {
		t.Errorf("key over class: %+v, want %+v", got, want)
	}
}

func TestParse_NoSLOByDefault(t *testing.T) {
	cfg, err := parse(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Admission.SLO) != 0 {
		t.Fatalf("default admission.slo %v, want none (the derived default applies)", cfg.Admission.SLO)
	}
}

func TestCheck_SLOProblemsNameTheirKey(t *testing.T) {
	const file = `workers: [{name: a, url: 'http://h:1'}]
admission:
  slo:
    interactve: {ttft: 1s}
    batch:
      ttft: -2s
      min_decode_tok_s: -1
      on_miss: drop
    gold: {ttft: 1s}
auth:
  keys:
    - key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      tenant: ide
      slo: {ttft_per_1k_prompt_tokens: -1s, on_miss: later}
`
	rep := Check("sluice.yaml", []byte(file))
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.Error())
	}
	want := []string{
		"sluice.yaml:4: admission.slo.interactve: \"interactve\" is not one of admission.classes (interactive, batch); did you mean `interactive`?",
		"sluice.yaml:6: admission.slo.batch.ttft: negative (-2s); leave it out to take the default",
		"sluice.yaml:7: admission.slo.batch.min_decode_tok_s: must be a positive number of tokens/s, got -1",
		`sluice.yaml:8: admission.slo.batch.on_miss: "drop" is not serve or refuse`,
		`sluice.yaml:9: admission.slo.gold: "gold" is not one of admission.classes (interactive, batch)`,
		"sluice.yaml:14: auth.keys[0].slo.ttft_per_1k_prompt_tokens: negative (-1s); leave it out to take the default",
		`sluice.yaml:14: auth.keys[0].slo.on_miss: "later" is not serve or refuse`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}

func TestCheck_SLOUnderAClassPointsToAdmissionSLO(t *testing.T) {
	rep := Check("", []byte("workers: [{name: a, url: 'http://h:1'}]\nadmission:\n  classes:\n    - {name: interactive, slo: {ttft: 1s}}\n"))
	if len(rep.Problems) != 1 {
		t.Fatalf("problems %v, want one", rep.Problems)
	}
	if got, want := rep.Problems[0].Error(), "line 4: admission.classes[0].slo: unknown key `slo` here; did you mean `admission.slo`?"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
