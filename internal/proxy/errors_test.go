package proxy

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sluice-router/sluice/internal/scheduler"
)

func TestStatusOf_AdmissionOutcomes(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{scheduler.ErrQueueFull, http.StatusTooManyRequests},
		{scheduler.ErrQueueTimeout, http.StatusServiceUnavailable},
		{scheduler.ErrNoHealthyWorker, http.StatusServiceUnavailable},
		{scheduler.ErrDeadlineUnmeetable, http.StatusServiceUnavailable},
		{fmt.Errorf("%w %q", scheduler.ErrUnknownClass, "urgent"), http.StatusBadRequest},
		{scheduler.ErrUnknownModel, http.StatusNotFound},
	}
	for _, tt := range tests {
		if got := StatusOf(&scheduler.Refusal{Err: tt.err}); got != tt.want {
			t.Errorf("StatusOf(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}
