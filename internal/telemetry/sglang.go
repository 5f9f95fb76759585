package telemetry

import "io"

// Metric names SGLang exposes on GET /metrics when started with
// --enable-metrics (python/sglang/srt/metrics/collector.py; the example in
// docs/references/production_metrics.md). Every scheduler series carries
// model_name; newer builds add engine_type, tp_rank, pp_rank, moe_ep_rank
// and, under data parallelism, dp_rank. sglang:token_usage is the fraction
// of the KV token pool in use, 0..1.
const (
	SGLangNumRunningReqs = "sglang:num_running_reqs"
	SGLangNumQueueReqs   = "sglang:num_queue_reqs"
	SGLangTokenUsage     = "sglang:token_usage"
	// SGLangModelLabel is the label that names the served model.
	SGLangModelLabel = "model_name"
	// SGLangDPRankLabel is the label of the data-parallel rank.
	SGLangDPRankLabel = "dp_rank"
)

// ParseSGLang reads SGLang's /metrics for one model.
//
// Model selection is the same as ParseVLLM's: a payload naming a single
// model_name is used whatever model says; with several, model picks one
// and an empty model aggregates them.
//
// Each data-parallel rank (dp_rank) runs its own scheduler and queue, so
// counts are summed across ranks. Series that differ only in the other
// rank labels (tensor or pipeline ranks reporting the same scheduler) are
// not added up: within one dp_rank the largest value is taken. The KV
// fraction is the largest of all, since a request may land on the fullest
// rank.
//
// Malformed text returns an error wrapping ErrMalformed. Absent metrics
// return the partial Metrics and a *MissingError.
func ParseSGLang(r io.Reader, model string) (Metrics, error) {
	return parseProm(r, "sglang", func(mfs familyMap, miss *missing) (Metrics, error) {
		keep, models := modelFilter(mfs, []string{SGLangNumRunningReqs, SGLangNumQueueReqs, SGLangTokenUsage}, SGLangModelLabel, model)
		m := Metrics{
			Running:  aggregate(mfs, SGLangNumRunningReqs, keep, sum, miss),
			QueueLen: aggregate(mfs, SGLangNumQueueReqs, keep, sum, miss),
			KVUsage:  aggregate(mfs, SGLangTokenUsage, keep, maxFraction, miss),
		}
		// Counts: largest within a dp_rank, summed across ranks.
		for _, v := range []*Value{&m.Running, &m.QueueLen} {
			if v.Present {
				v.V = sumByLabel(mfs, v.Metric, keep, SGLangDPRankLabel)
			}
		}
		if keep != nil {
			miss.forModel(SGLangModelLabel, model, models)
		}
		return m, nil
	})
}

// modelFilter returns the series filter for model among the families
// names, keyed by label: nil (keep all) when the payload names at most one
// model or model is empty. models lists the distinct values seen.
func modelFilter(mfs familyMap, names []string, label, model string) (keep func(sample) bool, models []string) {
	var all []sample
	for _, name := range names {
		ss, _ := samples(mfs, name)
		all = append(all, ss...)
	}
	models = labelValues(all, label)
	if len(models) > 1 && model != "" {
		keep = func(s sample) bool { return s.labels[label] == model }
	}
	return keep, models
}

// sumByLabel groups the kept finite series of name by the value of label
// (absent counts as one group), takes the largest value in each group and
// sums the groups.
func sumByLabel(mfs familyMap, name string, keep func(sample) bool, label string) float64 {
	ss, _ := samples(mfs, name)
	groups := map[string]float64{}
	for _, s := range ss {
		if (keep != nil && !keep(s)) || !finite(s.value) {
			continue
		}
		g := s.labels[label]
		if v, ok := groups[g]; !ok || s.value > v {
			groups[g] = s.value
		}
	}
	var total float64
	for _, v := range groups {
		total += max(v, 0)
	}
	return total
}
