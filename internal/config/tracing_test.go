package config

import (
	"strings"
	"testing"
)

func TestParse_TracingOffByDefaultAndValidated(t *testing.T) {
	cfg, err := parse("workers: [{name: a, url: 'http://h:1'}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing.OTLPEndpoint != "" || cfg.Tracing.SampleRatio != 1 || cfg.Tracing.ServiceName != "sluice" {
		t.Errorf("defaults %+v: want off, ratio 1, service sluice", cfg.Tracing)
	}
	_, err = parse("workers: [{name: a, url: 'http://h:1'}]\ntracing: {otlp_endpoint: 'collector:4318', sample_ratio: 2}\n")
	for _, key := range []string{"tracing.otlp_endpoint", "tracing.sample_ratio"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("err %v, want it to name %s", err, key)
		}
	}
	if _, err := parse("workers: [{name: a, url: 'http://h:1'}]\ntracing: {otlp_endpoint: 'http://collector:4318'}\n"); err != nil {
		t.Errorf("valid tracing refused: %v", err)
	}
}
