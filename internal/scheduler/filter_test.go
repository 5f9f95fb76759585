package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// Each filter, on a pick built by hand: which views it keeps, in order,
// and the reason code it leaves on the others (views it keeps are not
// touched).
func TestFilters(t *testing.T) {
	type w struct {
		name     string
		snap     snapshot.Snapshot
		draining bool
		serving  bool
		active   int
		limit    int
	}
	ok := snapshot.Snapshot{Health: snapshot.HealthOK}
	tests := []struct {
		name     string
		why      uint8
		req      Request
		baseline bool
		ws       []w
		want     []string
	}{
		{"draining", whyDraining, Request{}, false, []w{{name: "a", draining: true}, {name: "b"}}, []string{"b"}},
		{"down", whyDown, Request{}, false, []w{{name: "a", snap: snapshot.Snapshot{Health: snapshot.HealthDown}}, {name: "b", snap: snapshot.Snapshot{Health: snapshot.HealthUnknown}}}, []string{"b"}},
		{"loading the worker", whyLoading, Request{Model: "m"}, false, []w{{name: "a", snap: snapshot.Snapshot{Health: snapshot.HealthLoading}}, {name: "b", snap: ok}}, []string{"b"}},
		{"loading this model", whyLoading, Request{Model: "m"}, false, []w{{name: "a", snap: snapshot.Snapshot{Health: snapshot.HealthOK, LoadingModels: []string{"m"}}}, {name: "b", snap: snapshot.Snapshot{Health: snapshot.HealthOK, LoadingModels: []string{"other"}}}}, []string{"b"}},
		{"model", whyModel, Request{}, false, []w{{name: "a", serving: true}, {name: "b"}, {name: "c", serving: true}}, []string{"a", "c"}},
		{"excluded", whyExcluded, Request{Exclude: []string{"b"}}, false, []w{{name: "a"}, {name: "b"}}, []string{"a"}},
		{"context", whyContext, Request{PromptTokens: 3000}, false, []w{{name: "a", snap: snapshot.Snapshot{ContextTokens: 2048}}, {name: "b", snap: snapshot.Snapshot{ContextTokens: 4096}}, {name: "c"}}, []string{"b", "c"}},
		{"limit", whyFull, Request{}, false, []w{{name: "a", active: 2, limit: 2}, {name: "b", active: 1, limit: 2}}, []string{"b"}},
		{"no limit for baselines", whyFull, Request{}, true, []w{{name: "a", active: 2, limit: 2}}, []string{"a"}},
		{"kv fit", whyKVFit, Request{PromptTokens: 1000}, false, []w{{name: "a", snap: snapshot.Snapshot{KVPoolTokens: 4000}, active: 1}, {name: "b", snap: snapshot.Snapshot{KVPoolTokens: 8000}, active: 1}}, []string{"b"}},
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
				p.views[i] = view{w: wk, snap: &snap, serving: x.serving, lim: viewLimit{limit: x.limit}, active: wk.active, cost: wk.cost, draining: wk.draining}
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

// keepRules, the rules in one pass, keeps the views and leaves the reason
// codes that running each rule's keep in turn does, on picks where any
// rule may fail and several may fail on the same view.
func TestKeepRules(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	build := func(seed uint64) *pick {
		r := rand.New(rand.NewPCG(seed, 5))
		flip := func() bool { return r.IntN(4) == 0 }
		p := &pick{req: Request{Model: "m", PromptTokens: 3000}, baseline: flip()}
		if flip() {
			p.req.Exclude = []string{"w1", "w3"}
		}
		if flip() {
			p.req.Kinds = []string{"vllm"}
		}
		if flip() {
			p.req.Route = "/v1/messages"
		}
		p.env.Req = &p.req
		p.views = make([]view, 1+r.IntN(8))
		for i := range p.views {
			snap := &snapshot.Snapshot{Health: []snapshot.Health{snapshot.HealthOK, snapshot.HealthUnknown, snapshot.HealthDown, snapshot.HealthLoading}[r.IntN(4)], ContextTokens: []int{0, 2048, 4096}[r.IntN(3)]}
			if flip() {
				snap.LoadingModels = []string{"m"}
			}
			spec := WorkerSpec{Name: fmt.Sprintf("w%d", i), Kind: []string{"vllm", "llamacpp"}[r.IntN(2)]}
			if flip() {
				spec.Unserved = []string{"/v1/messages"}
			}
			w := &worker{spec: spec, order: i, draining: flip(), active: r.IntN(3)}
			p.views[i] = view{w: w, snap: snap, serving: !flip(), lim: viewLimit{limit: r.IntN(4)}, active: w.active, draining: w.draining}
		}
		return p
	}
	for iter := range 500 {
		seed := rng.Uint64()
		want, got := build(seed), build(seed)
		var wantIn, gotIn []int32
		for i := range want.views {
			wantIn, gotIn = append(wantIn, int32(i)), append(gotIn, int32(i))
		}
		for why := whyDraining; why <= whyFull; why++ {
			wantIn = filters[why].keep(want, wantIn, why)
		}
		gotIn = keepRules(got, gotIn)
		if diff := cmp.Diff(wantIn, gotIn); diff != "" {
			t.Fatalf("pick %d: kept (-each rule in turn +in one pass):\n%s", iter, diff)
		}
		for i := range want.views {
			if w, g := want.views[i].why, got.views[i].why; w != g {
				t.Fatalf("pick %d, view %d: why %d in one pass, %d by each rule in turn", iter, i, g, w)
			}
		}
	}
}
