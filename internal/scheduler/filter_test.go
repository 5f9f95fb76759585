package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Each filter, on a pick built by hand: which views it keeps, in order,
// and the reason code it leaves on the others (views it keeps are not
// touched).
func TestFilters(t *testing.T) {
	type w struct {
		name     string
		snap     Snapshot
		draining bool
		serving  bool
		active   int
		limit    int
	}
	ok := Snapshot{Health: HealthOK}
	tests := []struct {
		name     string
		why      uint8
		req      Request
		baseline bool
		ws       []w
		want     []string
	}{
		{"draining", whyDraining, Request{}, false, []w{{name: "a", draining: true}, {name: "b"}}, []string{"b"}},
		{"down", whyDown, Request{}, false, []w{{name: "a", snap: Snapshot{Health: HealthDown}}, {name: "b", snap: Snapshot{Health: HealthUnknown}}}, []string{"b"}},
		{"loading the worker", whyLoading, Request{Model: "m"}, false, []w{{name: "a", snap: Snapshot{Health: HealthLoading}}, {name: "b", snap: ok}}, []string{"b"}},
		{"loading this model", whyLoading, Request{Model: "m"}, false, []w{{name: "a", snap: Snapshot{Health: HealthOK, LoadingModels: []string{"m"}}}, {name: "b", snap: Snapshot{Health: HealthOK, LoadingModels: []string{"other"}}}}, []string{"b"}},
		{"model", whyModel, Request{}, false, []w{{name: "a", serving: true}, {name: "b"}, {name: "c", serving: true}}, []string{"a", "c"}},
		{"excluded", whyExcluded, Request{Exclude: []string{"b"}}, false, []w{{name: "a"}, {name: "b"}}, []string{"a"}},
		{"context", whyContext, Request{PromptTokens: 3000}, false, []w{{name: "a", snap: Snapshot{ContextTokens: 2048}}, {name: "b", snap: Snapshot{ContextTokens: 4096}}, {name: "c"}}, []string{"b", "c"}},
		{"limit", whyFull, Request{}, false, []w{{name: "a", active: 2, limit: 2}, {name: "b", active: 1, limit: 2}}, []string{"b"}},
		{"no limit for baselines", whyFull, Request{}, true, []w{{name: "a", active: 2, limit: 2}}, []string{"a"}},
		{"kv fit", whyKVFit, Request{PromptTokens: 1000}, false, []w{{name: "a", snap: Snapshot{KVPoolTokens: 4000}, active: 1}, {name: "b", snap: Snapshot{KVPoolTokens: 8000}, active: 1}}, []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &pick{req: tt.req, baseline: tt.baseline}
			p.env.Req = &p.req
			p.views = make([]view, len(tt.ws))
			var in []int32
			for i, x := range tt.ws {
				snap := x.snap
				wk := &worker{spec: WorkerSpec{Name: x.name}, order: i, draining: x.draining, active: x.active}
				if tt.name == "kv fit" {
					wk.cost = 3500 // a's 4,000-token cache holds 3,500 already
				}
				p.views[i] = view{w: wk, snap: &snap, serving: x.serving, lim: limitState{limit: x.limit}}
				in = append(in, int32(i))
			}
			out := filters[tt.why].keep(p, in, tt.why)
			var got []string
			for _, i := range out {
				got = append(got, p.views[i].w.spec.Name)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("kept (-want +got):\n%s", diff)
			}
			for i := range p.views {
				v := &p.views[i]
				kept := false
				for _, o := range out {
					kept = kept || int(o) == i
				}
				if want := map[bool]uint8{true: whyEligible, false: tt.why}[kept]; v.why != want {
					t.Errorf("%s: why %d, want %d", v.w.spec.Name, v.why, want)
				}
			}
		})
	}
}
