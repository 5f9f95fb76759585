package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeBin writes an executable script called name into dir.
func fakeBin(t *testing.T, dir, name, script string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestCI_InstallsOnlyWhatIsMissing runs .ci/install-deps with a PATH
// holding only fakes: the packages a case has, and an apt-get that records
// its calls. A machine that has every package must see no apt-get at all
// (no update either); otherwise one update and one install of exactly what
// is missing.
func TestCI_InstallsOnlyWhatIsMissing(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed to run .ci/install-deps")
	}
	script, err := filepath.Abs("../.ci/install-deps")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		have    []string // commands on the PATH
		noApt   bool     // no apt-get either
		aptFail bool     // apt-get exits 100
		calls   []string // apt-get calls, one a line
		wantErr string   // in stderr, when the script must fail
	}{
		{name: "everything present", have: []string{"gcc", "redis-server", "chromium"}},
		{name: "another browser name", have: []string{"gcc", "redis-server", "google-chrome"}},
		{name: "redis missing", have: []string{"gcc", "chromium"},
			calls: []string{"update", "install -y redis-server"}},
		{name: "all missing", calls: []string{"update", "install -y gcc redis-server chromium"}},
		{name: "apt-get fails", have: []string{"gcc", "redis-server"}, aptFail: true,
			calls: []string{"update"}, wantErr: "apt-get failed"},
		{name: "nothing to install with", have: []string{"gcc"}, noApt: true,
			wantErr: "missing redis-server chromium and no apt-get"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := t.TempDir()
			log := filepath.Join(t.TempDir(), "apt-get.log")
			for _, name := range tt.have {
				fakeBin(t, bin, name, "exit 0")
			}
			if !tt.noApt {
				exit := "exit 0"
				if tt.aptFail {
					exit = `echo "apt-get failed" >&2; exit 100`
				}
				fakeBin(t, bin, "apt-get", `echo "$*" >> `+log+`; `+exit)
			}
			fakeBin(t, bin, "sudo", `exec "$@"`) // for a run as another user than root
			cmd := exec.Command(bash, script)
			cmd.Env = []string{"PATH=" + bin, "HOME=" + t.TempDir()}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantErr) {
					t.Errorf("err %v, stderr %q; want a failure saying %q", err, stderr.String(), tt.wantErr)
				}
			} else if err != nil {
				t.Fatalf("install-deps: %v; stderr:\n%s", err, stderr.String())
			}
			var calls []string
			if b, err := os.ReadFile(log); err == nil {
				calls = strings.Split(strings.TrimSpace(string(b)), "\n")
			}
			if diff := cmp.Diff(tt.calls, calls); diff != "" {
				t.Errorf("apt-get calls (-want +got):\n%s", diff)
			}
		})
	}
}
