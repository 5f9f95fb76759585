package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersion_ReportsModuleAndToolchain(t *testing.T) {
	var out bytes.Buffer
	if err := versionTo(&out, nil); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"sluice ", "module   github.com/sluice-router/sluice", runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(text, want) {
			t.Errorf("output %q lacks %q", text, want)
		}
	}

	out.Reset()
	if err := versionTo(&out, []string{"--json"}); err != nil {
		t.Fatal(err)
	}
	var bi buildInfo
	if err := json.Unmarshal(out.Bytes(), &bi); err != nil {
		t.Fatalf("--json: %v: %s", err, out.String())
	}
	if bi.Module != "github.com/sluice-router/sluice" || bi.Version == "" || !strings.HasPrefix(bi.Go, "go") {
		t.Errorf("build info %+v", bi)
	}
	if err := versionTo(&out, []string{"extra"}); err == nil {
		t.Error("stray argument accepted")
	}
}

func TestVersion_VCSStampsAreRead(t *testing.T) {
	info := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/sluice-router/sluice", Version: "v0.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0cee63e4b37a49901e44d98abebd7e384d35a0c4"},
			{Key: "vcs.time", Value: "2026-12-03T05:50:35Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(info)
	want := buildInfo{
		Version: "v0.4.0", Module: "github.com/sluice-router/sluice",
		Revision: "0cee63e4b37a49901e44d98abebd7e384d35a0c4", Time: "2026-12-03T05:50:35Z", Modified: true,
		Go: "go1.26.8", Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	if got != want {
		t.Errorf("fromBuildInfo = %+v, want %+v", got, want)
	}
	if got := fromBuildInfo(nil); got.Version != "unknown" || got.Go == "" {
		t.Errorf("no build info: %+v", got)
	}
}

func TestVersion_LinkTimeVersionWins(t *testing.T) {
	old := version
	version = "v9.9.9"
	t.Cleanup(func() { version = old })
	if got := readBuildInfo().Version; got != "v9.9.9" {
		t.Errorf("Version = %q, want the -X main.version value", got)
	}
}

// TestModule_InstallableWithGoInstall checks what `go install
// github.com/sluice-router/sluice/cmd/sluice@latest` needs: the module
// path matches the import path and go.mod has no replace directive (go
// install refuses modules that have one).
func TestModule_InstallableWithGoInstall(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	module := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m, ok := strings.CutPrefix(line, "module "); ok {
			module = strings.TrimSpace(m)
		}
		if strings.HasPrefix(line, "replace ") || line == "replace (" {
			t.Errorf("go.mod has a replace directive: %q", line)
		}
	}
	if module != "github.com/sluice-router/sluice" {
		t.Errorf("module %q, want github.com/sluice-router/sluice", module)
	}
}
