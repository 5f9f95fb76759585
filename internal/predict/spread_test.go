package predict

import (
	"math"
	"testing"

	"github.com/sluice-router/sluice/internal/stats"
)

func TestLevelCV_FallsBackToTheNearestLevelBelow(t *testing.T) {
	ws := &stats.WorkerStats{Levels: stats.NewLevels([]stats.Level{
		{DecodeTPS: stats.EMA{Value: 40, N: 20}, DecodeSq: stats.EMA{Value: 40*40 + 4*4, N: 20}}, // sd 4
		{DecodeTPS: stats.EMA{Value: 30, N: 2}, DecodeSq: stats.EMA{Value: 30*30 + 9*9, N: 2}},   // too few
	}...)}
	for _, tt := range []struct {
		k    int
		want float64
	}{{1, 0.1}, {2, 0.1}, {3, 0.1}} {
		if got := levelCV(ws, tt.k); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("levelCV(k=%d) = %v, want %v", tt.k, got, tt.want)
		}
	}
	if got := levelCV(nil, 2); got != 0 {
		t.Errorf("levelCV without stats = %v, want 0", got)
	}
	if got := levelCV(&stats.WorkerStats{}, 2); got != 0 {
		t.Errorf("levelCV without levels = %v, want 0", got)
	}
}
