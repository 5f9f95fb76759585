package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfigFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigCheck_GoodFile(t *testing.T) {
	path := writeConfigFile(t, "workers:\n  - {name: a, url: 'http://10.0.0.5:8080'}\n  - {name: b, url: 'http://10.0.0.6:30000', kind: sglang}\n")
	var out bytes.Buffer
	if err := configCheck(&out, []string{"--config", path}); err != nil {
		t.Fatalf("err %v; output %s", err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "ok: 2 worker(s) (1 llamacpp, 1 sglang)") {
		t.Errorf("output %q", got)
	}
}

func TestConfigCheck_ListsEveryProblemByKey(t *testing.T) {
	path := writeConfigFile(t, "listen: nowhere\nworkers:\n  - {name: a, url: 'ftp://x', kind: triton}\n  - {name: a, url: 'http://h:1'}\n")
	var out bytes.Buffer
	err := configCheck(&out, []string{"--config", path})
	if err == nil {
		t.Fatal("bad config accepted")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, key := range []string{"listen:", "workers[0].url:", "workers[0].kind:", "workers[1].name:"} {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, key)
		}
		if !found {
			t.Errorf("no line names %s in:\n%s", key, out.String())
		}
	}
	if !strings.Contains(err.Error(), "problem(s)") {
		t.Errorf("err %q, want a count of problems", err)
	}
}

// TestConfigCheck_ReportsEveryProblemAtOnce checks the first-hour file of
// the issue: a typo and a duration without its unit must not hide the
// URL, kind, weight and store problems beside them; each is printed with
// the file, line and key, the typo with the key it is near, and the count
// in the error is the count of lines printed.
func TestConfigCheck_ReportsEveryProblemAtOnce(t *testing.T) {
	path := writeConfigFile(t, `workers:
  - name: a
    url: ftp://gpu-a
    kind: triton
    max_concurency: 4
admission:
  queue_timeout: '30'
weights:
  prefix: -1
stats:
  store: 'etcd://h:1'
`)
	var out bytes.Buffer
	err := configCheck(&out, []string{"--config", path})
	if err == nil {
		t.Fatal("bad config accepted")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		path + ":3: workers[0].url:",
		path + ":4: workers[0].kind:",
		path + ":5: workers[0].max_concurency: unknown key `max_concurency`; did you mean `max_concurrency`?",
		path + ":7: admission.queue_timeout: must be a duration",
		path + ":9: weights.prefix:",
		path + ":11: stats.store:",
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start %q", i+1, lines[i], w)
		}
	}
	if got, want := err.Error(), fmt.Sprintf("%s: %d problem(s)", path, len(want)); got != want {
		t.Errorf("err %q, want %q", got, want)
	}
	for _, goSpeak := range []string{"time.Duration", "config.Worker", "not found in type", "unmarshal"} {
		if strings.Contains(out.String(), goSpeak) {
			t.Errorf("output speaks Go (%q):\n%s", goSpeak, out.String())
		}
	}
}

func TestConfigCheck_UnknownKeyAndMissingFile(t *testing.T) {
	var out bytes.Buffer
	path := writeConfigFile(t, "workers:\n  - {name: a, url: 'http://h:1', colour: red}\n")
	if err := configCheck(&out, []string{"--config", path}); err == nil || !strings.Contains(out.String(), "colour") {
		t.Errorf("unknown key: err %v, output %q", err, out.String())
	}
	if err := configCheck(&out, []string{"--config", filepath.Join(t.TempDir(), "none.yaml")}); err == nil {
		t.Error("missing file accepted")
	}
	if err := configCheck(&out, nil); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("no file: err %v", err)
	}
	if err := runConfig([]string{"lint"}); err == nil {
		t.Error("unknown config subcommand accepted")
	}
}

func TestConfigCheck_Discovery(t *testing.T) {
	var out bytes.Buffer
	good := writeConfigFile(t, "discovery:\n  kubernetes: {selector: 'kubernetes.io/service-name=vllm', kind: vllm, port_name: http}\n")
	if err := configCheck(&out, []string{"--config", good}); err != nil || !strings.Contains(out.String(), "discovery from EndpointSlices") {
		t.Errorf("discovery only: err %v, output %q", err, out.String())
	}
	out.Reset()
	bad := writeConfigFile(t, "discovery:\n  kubernetes: {selector: 'app in (vllm'}\n")
	if err := configCheck(&out, []string{"--config", bad}); err == nil || !strings.Contains(out.String(), "discovery.kubernetes.selector") {
		t.Errorf("bad selector: err %v, output %q", err, out.String())
	}
	out.Reset()
	out.Reset()
	// A bad selector is reported with the file's other problems.
	both := writeConfigFile(t, "listen: nowhere\ndiscovery:\n  kubernetes: {selector: 'app in (vllm'}\n")
	if err := configCheck(&out, []string{"--config", both}); err == nil || !strings.Contains(out.String(), both+":3: discovery.kubernetes.selector") || !strings.Contains(out.String(), both+":1: listen") {
		t.Errorf("bad selector and listen: err %v, output %q", err, out.String())
	}
	out.Reset()
	none := writeConfigFile(t, "discovery:\n  kubernetes: {kind: vllm}\n")
	if err := configCheck(&out, []string{"--config", none}); err == nil || !strings.Contains(out.String(), "discovery.kubernetes.selector: missing") {
		t.Errorf("no selector: err %v, output %q", err, out.String())
	}
}
