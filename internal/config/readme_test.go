package config

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// readmeSection returns the lines of docs/configuration.md (the
// configuration reference the README links) from the heading that
// starts with heading up to the next heading of the same level.
func readmeSection(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, heading):
			in = true
		case in && strings.HasPrefix(l, level):
			return out
		case in:
			out = append(out, l)
		}
	}
	if !in {
		t.Fatalf("docs/configuration.md has no %q section", heading)
	}
	return out
}

// tableRow is one row of a Markdown table, split into its cells.
func tableRows(lines []string) [][]string {
	var rows [][]string
	for _, l := range lines {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		// A \| inside a cell is a literal bar, not a cell boundary.
		l = strings.ReplaceAll(l, `\|`, "\x00")
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "\x00", "|"))
		}
		rows = append(rows, cells)
	}
	return rows
}

var backquoted = regexp.MustCompile("`([^`]+)`")

func quoted(cell string) []string {
	var out []string
	for _, m := range backquoted.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// configLeaf is a key of the config file whose value is written as a
// whole: a scalar, a list of scalars, a map of scalars. Lists and maps of
// sections are leaves too (parent), with their sections' keys as children.
type configLeaf struct {
	path     string // workers[].url, limits.models.*.min_stream_tok_s
	typ      reflect.Type
	def      reflect.Value // the default, when the path holds one value
	children []string      // keys of each item's section, for a list or map of sections
}

// configLeaves lists every key of Config with its default, by YAML name.
func configLeaves() []configLeaf {
	var out []configLeaf
	var walk func(t reflect.Type, v reflect.Value, path string)
	walk = func(t reflect.Type, v reflect.Value, path string) {
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
			if v.IsValid() && !v.IsNil() {
				v = v.Elem()
			} else {
				v = reflect.Value{}
			}
		}
		section := func(t reflect.Type) bool {
			return t.Kind() == reflect.Struct && t != durationType && !reflect.PointerTo(t).Implements(unmarshalerType)
		}
		switch {
		case section(t):
			names := yamlFields(t)
			keys := make([]string, 0, len(names))
			for k := range names {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				var fv reflect.Value
				if v.IsValid() {
					fv = v.Field(names[k])
				}
				walk(t.Field(names[k]).Type, fv, join(path, k))
			}
		case (t.Kind() == reflect.Slice || t.Kind() == reflect.Map) && section(t.Elem()):
			sub := path + "[]"
			if t.Kind() == reflect.Map {
				sub = path + ".*"
			}
			leaf := configLeaf{path: path, typ: t, def: v}
			for k := range yamlFields(t.Elem()) {
				leaf.children = append(leaf.children, k)
			}
			slices.Sort(leaf.children)
			out = append(out, leaf)
			walk(t.Elem(), reflect.Value{}, sub)
		default:
			out = append(out, configLeaf{path: path, typ: t, def: v})
		}
	}
	def := DefaultConfig()
	walk(reflect.TypeFor[Config](), reflect.ValueOf(def), "")
	return out
}

// documentedElsewhere are the sections the README documents with a YAML
// example of their own instead of rows of the configuration table.
var documentedElsewhere = []string{"tracing", "discovery"}

// appliedWhereUsed are keys whose zero value in DefaultConfig stands for a
// default applied where the value is used; the table shows that default.
var appliedWhereUsed = map[string]bool{
	"stats.redis_prefix": true, // redisconn: "sluice:"
	"shared.replica":     true, // host-port
}

// TestReadme_ConfigTableMatchesTheCode holds the README's configuration
// table to Config: every key of the file is documented (in the table, or
// in the YAML example of its own section), every key the table names
// exists, and every default the table states is DefaultConfig's.
func TestReadme_ConfigTableMatchesTheCode(t *testing.T) {
	leaves := configLeaves()
	byPath := map[string]configLeaf{}
	for _, l := range leaves {
		byPath[l.path] = l
	}
	documented := map[string]bool{}
	section := readmeSection(t, "## Configuration")
	if i := slices.IndexFunc(section, func(l string) bool { return strings.HasPrefix(l, "### ") }); i >= 0 {
		section = section[:i] // the subsections' tables are of other things
	}
	for _, row := range tableRows(section) {
		keyCell, defCell, meaning := row[0], row[1], strings.Join(row[2:], "|")
		keys := quoted(keyCell)
		for _, k := range keys {
			def := defCell
			if len(keys) > 1 {
				def = "" // one default cell for several keys: not checked
			}
			checkKey(t, byPath, documented, k, def, meaning+" "+defCell)
		}
	}
	yamlKeys := readmeYAMLKeys(t)
	for _, l := range leaves {
		if documented[l.path] || covered(documented, l.path) {
			continue
		}
		if l.children != nil && slices.ContainsFunc(slices.Collect(maps.Keys(documented)), func(p string) bool {
			return within(p, l.path+"[]") || within(p, l.path+".*")
		}) {
			continue // a list or map of sections whose keys have rows
		}
		elsewhere := slices.ContainsFunc(documentedElsewhere, func(p string) bool { return within(l.path, p) })
		if elsewhere && yamlKeys[strings.ReplaceAll(l.path, "[]", "")] {
			continue
		}
		if elsewhere {
			t.Errorf("%s: not in the README's YAML example of its section", l.path)
			continue
		}
		t.Errorf("%s: not in the README's configuration table", l.path)
	}
}

// covered reports whether path lies under a documented list or map of
// sections (auth.keys[] documents auth.keys[].tenant).
func covered(documented map[string]bool, path string) bool {
	for p := range documented {
		if within(path, p) || within(path, p+"[]") || within(path, p+".*") {
			return true
		}
	}
	return false
}

// checkKey checks one key the table names: it exists, its default is
// DefaultConfig's, and a list or map of sections names its keys.
func checkKey(t *testing.T, byPath map[string]configLeaf, documented map[string]bool, key, def, text string) {
	t.Helper()
	path := strings.TrimSuffix(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(key, "*"), "[]")
	l, ok := byPath[path]
	if !ok {
		t.Errorf("the table documents %s, which Config does not have", key)
		return
	}
	documented[path] = true
	for _, c := range l.children {
		if !strings.Contains(text, "`"+c+"`") && !strings.Contains(text, c+":") {
			t.Errorf("%s: the row does not name its key %s", key, c)
		}
	}
	if def == "" || !l.def.IsValid() || appliedWhereUsed[path] {
		return
	}
	if got, ok := defaultMismatch(l, def); !ok {
		t.Errorf("%s: the table says the default is %q, the code %s", key, def, got)
	}
}

// defaultMismatch compares a table's default cell with the code's
// default; it returns the code's, written as the table would, and false
// when they differ.
func defaultMismatch(l configLeaf, cell string) (string, bool) {
	v := l.def
	if vals := quoted(cell); len(vals) == 1 && strings.HasPrefix(strings.TrimSpace(cell), "`") &&
		(l.typ.Kind() == reflect.Slice || l.typ.Kind() == reflect.Map) {
		// A YAML value: decode it and compare.
		p := reflect.New(l.typ)
		if err := yaml.Unmarshal([]byte(vals[0]), p.Interface()); err != nil {
			return "not a " + l.typ.String(), false
		}
		if p.Elem().Len() == 0 && v.Len() == 0 {
			return "", true
		}
		return fmt.Sprintf("%v", v.Interface()), reflect.DeepEqual(p.Elem().Interface(), v.Interface())
	}
	word := strings.Trim(strings.Fields(strings.ReplaceAll(cell, "`", ""))[0], ",")
	var code string
	switch {
	case l.typ == durationType:
		code = shortDuration(time.Duration(v.Int()))
	case v.Kind() == reflect.Bool:
		code = strconv.FormatBool(v.Bool())
	case v.CanInt():
		code = strconv.FormatInt(v.Int(), 10)
	case v.CanFloat():
		code = strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case v.Kind() == reflect.String:
		code = v.String()
	default:
		return "", true
	}
	if v.IsZero() {
		// A zero default reads as none, 0, false, auto, required…: the
		// table may only not state another literal value.
		_, isNum := strconv.ParseFloat(word, 64)
		_, isDur := time.ParseDuration(word)
		if (isNum == nil && word != code) || (isDur == nil && word != "0") || word == "true" {
			return code, false
		}
		return code, true
	}
	return code, word == code
}

// shortDuration writes d as the README does: 1m, not 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "m0s")
	if s != d.String() {
		s += "m"
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// readmeYAMLKeys returns the key paths of every ```yaml block of the
// README (list items as no index).
func readmeYAMLKeys(t *testing.T) map[string]bool {
	t.Helper()
	var text string
	for _, doc := range []string{"../../docs/configuration.md", "../../docs/kubernetes.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text += string(b)
	}
	out := map[string]bool{}
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(text, -1) {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(block[1]), &n); err != nil {
			t.Fatalf("a YAML block of the README does not parse: %v\n%s", err, block[1])
		}
		var walk func(n *yaml.Node, path string)
		walk = func(n *yaml.Node, path string) {
			switch n.Kind {
			case yaml.DocumentNode, yaml.SequenceNode:
				for _, c := range n.Content {
					walk(c, path)
				}
			case yaml.MappingNode:
				for i := 0; i+1 < len(n.Content); i += 2 {
					p := join(path, n.Content[i].Value)
					out[p] = true
					walk(n.Content[i+1], p)
				}
			}
		}
		walk(&n, "")
	}
	return out
}
