package redistest

import (
	"fmt"
	"runtime"
	"testing"
)

// outcomeTB is a testing.TB that records whether the code under test
// skipped or failed, ending its goroutine as the real ones do.
type outcomeTB struct {
	testing.TB
	skipped, failed string
}

func (o *outcomeTB) Helper()                   {}
func (o *outcomeTB) Skip(args ...any)          { o.skipped = fmt.Sprint(args...); runtime.Goexit() }
func (o *outcomeTB) Fatal(args ...any)         { o.failed = fmt.Sprint(args...); runtime.Goexit() }
func (o *outcomeTB) Fatalf(f string, a ...any) { o.failed = fmt.Sprintf(f, a...); runtime.Goexit() }

// TestStart_MissingServerFailsInCIAndSkipsElsewhere checks Start on a
// machine without redis-server: a developer's run skips the test, a CI run
// fails it, so the Redis suites can never pass unrun in CI.
func TestStart_MissingServerFailsInCIAndSkipsElsewhere(t *testing.T) {
	for _, tt := range []struct {
		ci       string
		wantFail bool
	}{{"true", true}, {"1", true}, {"", false}, {"false", false}} {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("PATH", t.TempDir()) // no redis-server on it
			t.Setenv("CI", tt.ci)
			o := &outcomeTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Start(o, Options{})
			}()
			<-done
			if tt.wantFail && (o.failed == "" || o.skipped != "") {
				t.Errorf("CI=%q: skipped %q, failed %q; want a failure", tt.ci, o.skipped, o.failed)
			}
			if !tt.wantFail && (o.skipped == "" || o.failed != "") {
				t.Errorf("CI=%q: skipped %q, failed %q; want a skip", tt.ci, o.skipped, o.failed)
			}
		})
	}
}
