package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// grafanaFile is the Grafana dashboard over Sluice's metrics.
const grafanaFile = "../../deploy/grafana/sluice.json"

// grafanaDashboard is the part of a Grafana dashboard JSON that queries.
type grafanaDashboard struct {
	UID    string         `json:"uid"`
	Panels []grafanaPanel `json:"panels"`
	Templ  struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	ID      int            `json:"id"`
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	Panels  []grafanaPanel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// promQuery is what one PromQL expression reads: metric names with the
// labels its selectors match on, and the labels it aggregates by.
type promQuery struct {
	metrics map[string][]string
	by      []string
}

var (
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	reSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}`)
	reMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	reBy       = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	reRange    = regexp.MustCompile(`\[[^\]]*\]`)
	reIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	reLabelVal = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
)

// parsePromQL finds the metrics and labels an expression uses. It is no
// full PromQL parser, only enough for the dashboard's queries: it fails
// on what it does not understand rather than let a name slip by.
func parsePromQL(t *testing.T, expr string) promQuery {
	t.Helper()
	q := promQuery{metrics: map[string][]string{}}
	e := reString.ReplaceAllString(expr, `""`)
	e = reBy.ReplaceAllStringFunc(e, func(m string) string {
		for _, l := range strings.Split(reBy.FindStringSubmatch(m)[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				q.by = append(q.by, l)
			}
		}
		return " "
	})
	e = reSelector.ReplaceAllStringFunc(e, func(m string) string {
		sm := reSelector.FindStringSubmatch(m)
		var labels []string
		for _, mm := range reMatcher.FindAllStringSubmatch(sm[2], -1) {
			labels = append(labels, mm[1])
		}
		if sm[1] == "" {
			t.Errorf("%q: selector without a metric name", expr)
		}
		q.metrics[sm[1]] = append(q.metrics[sm[1]], labels...)
		return " "
	})
	e = reRange.ReplaceAllString(e, " ")
	keywords := []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
	for _, m := range reIdent.FindAllStringSubmatch(e, -1) {
		name := m[0]
		if m[1] != "" || slices.Contains(keywords, name) { // a function call or an operator
			continue
		}
		if _, ok := q.metrics[name]; !ok {
			q.metrics[name] = nil
		}
	}
	if strings.ContainsAny(e, "{}") {
		t.Errorf("%q: could not read every selector", expr)
	}
	return q
}

// scrape returns the router's metric families.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// family finds the family a queried series name belongs to: the name
// itself, or a histogram's or summary's _bucket, _sum or _count.
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := fams[name]; ok {
		return f, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok && (f.GetType() == dto.MetricType_HISTOGRAM || (suf != "_bucket" && f.GetType() == dto.MetricType_SUMMARY)) {
			return f, true
		}
	}
	return nil, false
}

func hasLabel(f *dto.MetricFamily, label string) bool {
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				return true
			}
		}
	}
	return false
}

// targetLabels are added by Prometheus when it scrapes, not by Sluice.
var targetLabels = []string{"job", "instance"}

func TestGrafana_QueriesOnlyMetricsTheRouterExports(t *testing.T) {
	raw, err := os.ReadFile(grafanaFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", grafanaFile, err)
	}
	if dash.UID == "" {
		t.Errorf("%s has no uid: re-imports would duplicate it", grafanaFile)
	}

	// A router in front of one simulated worker, after one streamed
	// request, exports every series the dashboard reads.
	r := startRouter(t, 1, 20, nil)
	resp, body, err := r.chat(context.Background(), http.DefaultClient, true, 8)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request: %v %v %s", err, resp, body)
	}
	r.srv.ScrapeNow(context.Background())
	fams := scrape(t, r.url)

	type query struct{ where, expr string }
	var queries []query
	ids := map[int]string{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.RefID == "" || tg.Expr == "" {
					t.Errorf("panel %q has a target without refId or expr: %+v", p.Title, tg)
				}
				queries = append(queries, query{"panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	var labelValues int
	for _, v := range dash.Templ.List {
		if v.Type != "query" {
			continue
		}
		var s string
		switch q := v.Query.(type) {
		case string:
			s = q
		case map[string]any:
			s, _ = q["query"].(string)
		}
		m := reLabelVal.FindStringSubmatch(strings.TrimSpace(s))
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, s)
			continue
		}
		labelValues++
		queries = append(queries, query{"variable " + v.Name, m[1] + `{` + m[2] + `=""}`})
	}
	if len(queries) < 20 || labelValues == 0 {
		t.Fatalf("found %d queries and %d label_values variables in %s: the test reads too little", len(queries), labelValues, grafanaFile)
	}

	checked := map[string]bool{}
	for _, q := range queries {
		pq := parsePromQL(t, q.expr)
		if len(pq.metrics) == 0 {
			t.Errorf("%s: %q reads no metric", q.where, q.expr)
		}
		for name, labels := range pq.metrics {
			f, ok := family(fams, name)
			if !ok {
				t.Errorf("%s: %q reads %s, which the router's /metrics does not have", q.where, q.expr, name)
				continue
			}
			checked[name] = true
			for _, l := range labels {
				if !slices.Contains(targetLabels, l) && !hasLabel(f, l) {
					t.Errorf("%s: %q matches on label %q, which %s does not have", q.where, q.expr, l, name)
				}
			}
		}
		for _, l := range pq.by {
			if slices.Contains(targetLabels, l) {
				continue
			}
			found := false
			for name := range pq.metrics {
				if f, ok := family(fams, name); ok && (hasLabel(f, l) || (l == "le" && f.GetType() == dto.MetricType_HISTOGRAM)) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: %q aggregates by %q, which none of its metrics has", q.where, q.expr, l)
			}
		}
	}
	t.Logf("%d queries over %d metrics checked against a live router", len(queries), len(checked))
}

func TestParsePromQL_FindsNamesAndLabels(t *testing.T) {
	q := parsePromQL(t, `histogram_quantile(0.95, sum by (worker, le) (rate(sluice_ttft_seconds_bucket{job=~"$job", worker=~"a,b{c}"}[$__rate_interval]))) / ignoring(x) other_metric`)
	if got, want := q.metrics["sluice_ttft_seconds_bucket"], []string{"job", "worker"}; !slices.Equal(got, want) {
		t.Errorf("labels of the histogram = %v, want %v", got, want)
	}
	if _, ok := q.metrics["other_metric"]; !ok || len(q.metrics) != 2 {
		t.Errorf("metrics = %v, want the histogram and other_metric", q.metrics)
	}
	if want := []string{"worker", "le", "x"}; !slices.Equal(q.by, want) {
		t.Errorf("by = %v, want %v", q.by, want)
	}
}
