package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-router/sluice/internal/fleet"
)

// Problem is one thing wrong in a config file: where it is (the key path,
// and the line when the file is known) and what is wrong, in words an
// operator reads.
type Problem struct {
	// File is the config file's path; empty when the config did not come
	// from a file.
	File string
	// Line is the line of Key in the file; 0 when unknown.
	Line int
	// Key is the key path, e.g. workers[0].max_concurrency; empty for a
	// problem with the file as a whole (YAML that does not parse).
	Key string
	// Msg says what is wrong and, where it can, what would be right.
	Msg string
}

// Error is "FILE:LINE: key: message", leaving out what is unknown.
func (p *Problem) Error() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
	} else if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Problems is every problem found in a config, in the order of the file.
// Its Error is one problem a line.
type Problems []*Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As reach each Problem.
func (ps Problems) Unwrap() []error {
	out := make([]error, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// add appends a Problem for key.
func (ps *Problems) add(key, format string, args ...any) {
	*ps = append(*ps, &Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// Report is what Check found in a config file: the config as far as it
// could be decoded (defaults where a key was missing or wrong) and every
// problem, of decoding and of validation, each with its key path and line.
type Report struct {
	Config   Config
	Problems Problems
	file     string
	lines    map[string]int // key path -> line of the key in the file
}

// Add adds p to the report, giving it the file and the line of its key
// (or of the nearest enclosing key the file has) when it has none.
func (r *Report) Add(p *Problem) {
	if p.File == "" {
		p.File = r.file
	}
	if p.Line == 0 {
		p.Line = r.line(p.Key)
	}
	r.Problems = append(r.Problems, p)
}

// Err returns the problems as an error (a Problems), or nil when there
// are none.
func (r *Report) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return r.Problems
}

// line is the line of key, or of the nearest enclosing key present in the
// file: a missing workers[0].url is reported on the line of workers[0].
func (r *Report) line(key string) int {
	for key != "" {
		if l, ok := r.lines[key]; ok {
			return l
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// Check decodes data (YAML) over DefaultConfig and validates the result.
// Unlike a strict YAML decode, which stops at the first kind of problem,
// it goes on past unknown keys and values of the wrong type, so one run
// reports every problem in the file: the wrong key or value keeps its
// default, and validation then checks everything else. file names the
// file in the problems; it may be empty.
func Check(file string, data []byte) *Report {
	r := &Report{Config: DefaultConfig(), file: file, lines: map[string]int{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		r.Add(syntaxProblem(err))
		return r
	}
	d := &decoder{r: r}
	if len(doc.Content) > 0 {
		d.value(doc.Content[0], reflect.ValueOf(&r.Config).Elem(), "")
	}
	for i := range r.Config.Workers {
		if r.Config.Workers[i].Kind == "" {
			r.Config.Workers[i].Kind = fleet.KindLlamaCPP
		}
	}
	decoded := len(r.Problems)
	for _, p := range r.Config.problems() {
		// A key whose value did not decode was left at its default;
		// what validation says of that default would only repeat the
		// problem.
		if !slices.ContainsFunc(r.Problems[:decoded], func(q *Problem) bool { return within(p.Key, q.Key) }) {
			r.Add(p)
		}
	}
	slices.SortStableFunc(r.Problems, func(a, b *Problem) int {
		// File order; problems with no line (a key the file leaves
		// out, whose default is wrong together with another key) last.
		return cmp.Compare(lineOrMax(a.Line), lineOrMax(b.Line))
	})
	return r
}

func lineOrMax(l int) int {
	if l == 0 {
		return math.MaxInt
	}
	return l
}

// within reports whether key is parent or lies below it.
func within(key, parent string) bool {
	if parent == "" || !strings.HasPrefix(key, parent) {
		return false
	}
	rest := key[len(parent):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxProblem reports YAML that does not parse, on its line.
func syntaxProblem(err error) *Problem {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		l, _ := strconv.Atoi(m[1])
		return &Problem{Line: l, Msg: "not valid YAML: " + m[2]}
	}
	return &Problem{Msg: "not valid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// decoder walks a YAML node tree alongside the Config it fills, by
// reflection, recording the line of every key and a Problem for every
// key or value it cannot take. It follows yaml.v3's rules for what it
// accepts (a differential fuzz test holds it to them): null leaves a
// value at its default (and empties a list, map or pointer), a list
// replaces the default list, merge keys (<<) and aliases are followed.
type decoder struct {
	r *Report
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// value decodes n into v, the value at key.
func (d *decoder) value(n *yaml.Node, v reflect.Value, key string) {
	n = resolve(n)
	if _, seen := d.r.lines[key]; !seen && key != "" {
		d.r.lines[key] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		switch v.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice:
			v.SetZero()
		}
		return
	}
	if reflect.PointerTo(v.Type()).Implements(unmarshalerType) {
		fresh := reflect.New(v.Type())
		if err := n.Decode(fresh.Interface()); err != nil {
			d.bad(n, key, "%s", unmarshalMessage(err))
			return
		}
		v.Set(fresh.Elem())
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, v.Elem(), key)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.bad(n, key, "must be a section of keys (key: value, one a line below it), got %s", describe(n))
			return
		}
		d.structure(n, v, key)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.bad(n, key, "must be a list (one `- item` a line, or [a, b]), got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			ik := fmt.Sprintf("%s[%d]", key, i)
			if item.Kind == yaml.ScalarNode && item.ShortTag() == "!!null" {
				d.bad(item, ik, "%s", emptyItem)
				continue
			}
			d.value(item, s.Index(i), ik)
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.bad(n, key, "must be a map of names to values (name: value), got %s", describe(n))
			return
		}
		d.mapping(n, v, key)
	default:
		d.scalar(n, v, key)
	}
}

// emptyKey is the message for a key left empty (": value" or "~: value"),
// which a plain YAML decode would skip without a word.
const emptyKey = "empty key before a value (`: value`): write the key's name, or remove the line"

// emptyItem is the message for a list item left empty ("-" alone), which
// a plain YAML decode would drop without a word.
const emptyItem = "empty list item (`-` with nothing after it): fill it in, or remove the line"

// structure decodes a mapping into the struct v, one field per key.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, key string) {
	fields := yamlFields(v.Type())
	seen := map[string]int{}
	d.pairs(n, func(k, val *yaml.Node) {
		if !d.keyOK(k, key, "key", seen) {
			return
		}
		name := k.Value
		path := join(key, name)
		d.r.lines[path] = k.Line
		i, ok := fields[name]
		if !ok {
			msg, gone := removedKeys[path]
			if !gone {
				msg = unknownKey(name, v.Type(), key)
			}
			d.r.Add(&Problem{Key: path, Line: k.Line, Msg: msg})
			return
		}
		d.value(val, v.Field(i), path)
	})
}

// keyOK reports whether k, a key (what: "key" of a section, "name" of a
// map entry) under section key, is a word given once, reporting the
// problem when it is not; seen holds the lines of the keys met so far.
func (d *decoder) keyOK(k *yaml.Node, key, what string, seen map[string]int) bool {
	switch {
	case k.Kind != yaml.ScalarNode:
		d.bad(k, key, "a %s must be a word, got %s", what, describe(k))
		return false
	case k.ShortTag() == "!!null":
		d.bad(k, key, "%s", emptyKey)
		return false
	}
	if l, dup := seen[k.Value]; dup {
		d.bad(k, join(key, k.Value), "given twice (also on line %d); the second would silently win", l)
		return false
	}
	seen[k.Value] = k.Line
	return true
}

// mapping decodes a mapping into the map v, whose keys are strings.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, key string) {
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	seen := map[string]int{}
	d.pairs(n, func(k, val *yaml.Node) {
		if !d.keyOK(k, key, "name", seen) {
			return
		}
		name := k.Value
		path := join(key, name)
		d.r.lines[path] = k.Line
		mk := reflect.ValueOf(name).Convert(v.Type().Key())
		elem := reflect.New(v.Type().Elem()).Elem()
		if old := v.MapIndex(mk); old.IsValid() {
			elem.Set(old)
		}
		before := len(d.r.Problems)
		d.value(val, elem, path)
		if len(d.r.Problems) == before {
			v.SetMapIndex(mk, elem)
		}
	})
}

// pairs calls f for each key and value of the mapping n, the keys merged
// in with << first, as yaml.v3 does, so the mapping's own keys win.
func (d *decoder) pairs(n *yaml.Node, f func(k, v *yaml.Node)) {
	var own [][2]*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			d.merge(v, f)
			continue
		}
		own = append(own, [2]*yaml.Node{k, v})
	}
	for _, kv := range own {
		f(kv[0], kv[1])
	}
}

// merge applies the mapping, or list of mappings, of a << key.
func (d *decoder) merge(v *yaml.Node, f func(k, v *yaml.Node)) {
	switch v = resolve(v); v.Kind {
	case yaml.MappingNode:
		d.pairs(v, f)
	case yaml.SequenceNode:
		// Earlier mappings of the list win over later ones.
		for i := len(v.Content) - 1; i >= 0; i-- {
			m := resolve(v.Content[i])
			if m.Kind != yaml.MappingNode {
				d.bad(m, "", "<< merges mappings only, got %s", describe(m))
				continue
			}
			d.pairs(m, f)
		}
	default:
		d.bad(v, "", "<< merges mappings only, got %s", describe(v))
	}
}

// resolve follows n's aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// scalar decodes a plain value: text, number, true or false, duration.
func (d *decoder) scalar(n *yaml.Node, v reflect.Value, key string) {
	if n.Kind != yaml.ScalarNode {
		d.bad(n, key, "%s, got %s", wantScalar(v.Type()), describe(n))
		return
	}
	fresh := reflect.New(v.Type())
	if err := n.Decode(fresh.Interface()); err != nil || truncated(n, v.Type()) {
		d.bad(n, key, "%s, got %s", wantScalar(v.Type()), describe(n))
		return
	}
	v.Set(fresh.Elem())
}

// truncated reports whether n is a number with a fraction that yaml.v3
// would cut to fit the whole-number type t (max_attempts: 2.5 as 2).
// Check refuses it instead: the operator meant something else.
func truncated(n *yaml.Node, t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
	default:
		return false
	}
	if t == durationType || n.ShortTag() != "!!float" {
		return false
	}
	var f float64
	return n.Decode(&f) == nil && f != math.Trunc(f)
}

func (d *decoder) bad(n *yaml.Node, key, format string, args ...any) {
	d.r.Add(&Problem{Key: key, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
}

// wantScalar says what a value of type t must be, in an operator's words.
func wantScalar(t reflect.Type) string {
	if t == durationType {
		return "must be a duration with its unit, e.g. 30s, 500ms, 2m or 1h30m"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "must be true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "must be a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "must be a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "must be a number"
	case reflect.String:
		return "must be a text value"
	}
	return "has the wrong type"
}

// describe names what a node holds, for "got ..." in a message.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a section of keys"
	case yaml.ScalarNode:
		if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 {
			return fmt.Sprintf("the quoted text %q", n.Value)
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// unmarshalMessage is the message of a custom decoder's error, without
// yaml.v3's own wording around it.
func unmarshalMessage(err error) string {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
		if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
			msg = msg[i+2:]
		}
	}
	return msg
}

// yamlFields maps each YAML key of the struct type t to its field index.
func yamlFields(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = i
	}
	return out
}

// removedKeys are keys earlier releases had, by path, with what to do
// instead: a config naming one fails with that word rather than with a
// guess at a key it might have meant.
var removedKeys = map[string]string{
	"sessions.affinity":       "removed; a session's next request counts its last worker as holding its previous prompt, under weights.prefix; delete the key",
	"limits.policy":           "removed; a learned limit is lowered only where a level is worse for both the first token and the decode rate; delete the key",
	"weights.active_requests": "removed; the score weighs each request in flight at 100 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.queue_length":    "removed; the score weighs the worker's own queue at 10 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.latency":         "removed; the score weighs the worker's measured latency at 5 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.job_cost":        "removed; the score weighs the worker's outstanding tokens at 2 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.throughput":      "removed; the score rewards the worker's decode throughput at 3 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.kv_pressure":     "removed; the score weighs the worker's KV-cache use at 15 (of the weights, only weights.prefix is a setting); delete the key",
	"weights.gpu_util":        "removed; the score weighs the worker's GPU utilisation at 15 (of the weights, only weights.prefix is a setting); delete the key",
	"limits.adaptive":         "removed; the router always learns each worker's concurrency limit, below its max_concurrency (else its reported slots, else 64); delete the key",
	"limits.floor_fraction":   "removed; without limits.min_stream_tok_s the decode floor is half the best solo rate among the model's workers (set min_stream_tok_s for another floor); delete the key",
	"limits.min_samples":      "removed; the router judges a concurrency level after 3 streams; delete the key",
	"limits.probe_after":      "removed; a level judged too slow is tried again after 1m without new samples; delete the key",
	"limits.borrow_after":     "removed; for every 2s a request has waited, workers may run one stream over their learned limit, up to their cap; delete the key",
	"limits.default_cap":      "removed; a worker that reports no slots is capped at 64 (set its max_concurrency for another cap); delete the key",
	"admission.max_overtake":  "removed; no waiting request is overtaken by one that arrived more than 10s after it; delete the key",
	"policy":                  "removed; a router routes by Sluice's score (the baselines remain in sluice bench compare --policies, to compare against); delete the key",
	"stats.alpha":             "removed; each new sample moves a worker's moving averages by 0.2 of the gap; delete the key",
	"stats.flush_interval":    "removed; changed averages are written to stats.store every 1s; delete the key",
	"proxy.tokenize_above":    "removed; a prompt's size is estimated from its text, at the tokens per character the workers' usage reports once they have counted some of the model's prompts; delete the key",
	"proxy.tokenize_timeout":  "removed; a worker publishing KV events is given 200ms to give a request's token ids at /tokenize; delete the key",
	"hash_load_bound":         "removed; it bounded the consistent-hash baseline, which a router no longer runs (it remains in sluice bench compare --policies); delete the key",
}

// unknownKey is the message for a key the section at parent does not
// have: the nearest key of the section when one is close enough to be a
// typo, else the same key where it belongs when another section has it,
// else the keys the section has.
func unknownKey(name string, t reflect.Type, parent string) string {
	names := slices.Sorted(maps.Keys(yamlFields(t)))
	if near := nearest(name, names); near != "" {
		return fmt.Sprintf("unknown key `%s`; did you mean `%s`?", name, near)
	}
	if elsewhere := findKey(reflect.TypeFor[Config](), "", name); elsewhere != "" {
		return fmt.Sprintf("unknown key `%s` here; did you mean `%s`?", name, elsewhere)
	}
	where := "this section"
	if parent != "" {
		where = "`" + parent + "`"
	}
	return fmt.Sprintf("unknown key `%s`; %s has: %s", name, where, strings.Join(names, ", "))
}

// findKey returns the path of the first key called name in the config's
// sections (a list's items as [0]), breadth first: the shallowest wins.
func findKey(t reflect.Type, prefix, name string) string {
	type section struct {
		t      reflect.Type
		prefix string
	}
	queue := []section{{t, prefix}}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		t := s.t
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			if t.Kind() == reflect.Slice {
				s.prefix += "[0]"
			}
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == durationType || reflect.PointerTo(t).Implements(unmarshalerType) {
			continue
		}
		fields := yamlFields(t)
		if _, ok := fields[name]; ok {
			return join(s.prefix, name)
		}
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			queue = append(queue, section{t.Field(fields[k]).Type, join(s.prefix, k)})
		}
	}
	return ""
}

// typoDistance is how many edits apart a key may be from a known one and
// still be taken for a typo of it.
func typoDistance(name string) int {
	switch n := len(name); {
	case n <= 4:
		return 1
	case n <= 8:
		return 2
	}
	return 3
}

func join(key, name string) string {
	if key == "" {
		return name
	}
	return key + "." + name
}

// editDistance is the number of single-character insertions, deletions,
// substitutions and swaps of neighbours that turn a into b (optimal
// string alignment distance): "modle" is 1 from "model".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
