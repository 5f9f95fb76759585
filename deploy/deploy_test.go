package deploy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/template"
	"time"

	yaml "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/server"
)

// strict decodes manifests against the API types, refusing unknown and
// duplicate fields, as the API server's strict field validation does.
var strict = serializer.NewCodecFactory(manifestScheme(), serializer.EnableStrict).UniversalDeserializer()

// manifestScheme knows the API groups the manifests use, and only those:
// client-go's scheme.Scheme registers every group of the Kubernetes API,
// about a hundred packages more to compile (with -race, in CI) for a test
// that reads four. A kind of another group fails to decode, so a manifest
// that starts using one makes this list grow with it.
func manifestScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// decodeAll splits a multi-document YAML stream and decodes each document.
func decodeAll(t *testing.T, name string, data []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		if gvk.Kind == "" || gvk.Version == "" {
			t.Fatalf("%s document %d: no kind or apiVersion", name, i)
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestManifests_Kubernetes(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeAll(t, f, data)...)
	}
	checkBundle(t, objs)
}

// checkBundle checks that a set of objects is a working Sluice install.
func checkBundle(t *testing.T, objs []runtime.Object) {
	t.Helper()
	var (
		deps []*appsv1.Deployment
		svcs []*corev1.Service
		cms  []*corev1.ConfigMap
		pdbs []*policyv1.PodDisruptionBudget
		sas  []*corev1.ServiceAccount
		rbs  []*rbacv1.RoleBinding
		role []*rbacv1.Role
	)
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			deps = append(deps, o)
		case *corev1.Service:
			svcs = append(svcs, o)
		case *corev1.ConfigMap:
			cms = append(cms, o)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
		case *corev1.ServiceAccount:
			sas = append(sas, o)
		case *rbacv1.RoleBinding:
			rbs = append(rbs, o)
		case *rbacv1.Role:
			role = append(role, o)
		case *corev1.Namespace:
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	if len(deps) != 1 || len(svcs) != 1 || len(cms) != 1 || len(pdbs) != 1 || len(sas) != 1 || len(rbs) != 1 || len(role) != 1 {
		t.Fatalf("want one each of Deployment, Service, ConfigMap, PodDisruptionBudget, ServiceAccount, Role, RoleBinding; got %d %d %d %d %d %d %d",
			len(deps), len(svcs), len(cms), len(pdbs), len(sas), len(role), len(rbs))
	}
	d, svc, cm, pdb := deps[0], svcs[0], cms[0], pdbs[0]
	pod := d.Spec.Template
	podLabels := labels.Set(pod.Labels)

	sel, err := metaSelector(d.Spec.Selector.MatchLabels)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("deployment selector %v does not match its pods %v", d.Spec.Selector.MatchLabels, pod.Labels)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("service selector %v does not match the pods %v", svc.Spec.Selector, pod.Labels)
	}
	if sel, err := metaSelector(pdb.Spec.Selector.MatchLabels); err != nil || !sel.Matches(podLabels) {
		t.Errorf("PDB selector %v does not match the pods %v", pdb.Spec.Selector.MatchLabels, pod.Labels)
	}
	if pod.Spec.ServiceAccountName != sas[0].Name || rbs[0].Subjects[0].Name != sas[0].Name || rbs[0].RoleRef.Name != role[0].Name {
		t.Errorf("service account %q, binding %+v, role %q do not fit together", pod.Spec.ServiceAccountName, rbs[0], role[0].Name)
	}
	if rbs[0].Subjects[0].Namespace == "" {
		t.Error("RoleBinding subject has no namespace")
	}
	if !slices.ContainsFunc(role[0].Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "endpointslices") && slices.Contains(r.Verbs, "watch") && slices.Contains(r.Verbs, "list")
	}) {
		t.Error("role cannot list and watch endpointslices")
	}

	// Security: non-root, no privilege escalation, read-only root.
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod does not require a non-root user")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("container may escalate privileges or write its root filesystem")
	}

	// Ports: the probes and the service name a container port.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if svc.Spec.Ports[0].TargetPort.StrVal == "" || ports[svc.Spec.Ports[0].TargetPort.StrVal] == 0 {
		t.Errorf("service targetPort %v is not a container port %v", svc.Spec.Ports[0].TargetPort, ports)
	}
	probes := map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	wantPath := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}
	for name, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: none, or not HTTP", name)
			continue
		}
		if p.HTTPGet.Path != wantPath[name] {
			t.Errorf("%s probe path %q, want %q", name, p.HTTPGet.Path, wantPath[name])
		}
		if ports[p.HTTPGet.Port.StrVal] == 0 {
			t.Errorf("%s probe port %v is not a container port", name, p.HTTPGet.Port)
		}
	}

	// The config: mounted where the args point, valid, listening on the
	// container port, and its probe paths answered by a real router.
	if cm.Name != configMapOf(pod.Spec) {
		t.Errorf("pod mounts ConfigMap %q, the bundle has %q", configMapOf(pod.Spec), cm.Name)
	}
	if !slices.Contains(c.Args, "/etc/sluice/sluice.yaml") || !mounts(c, "/etc/sluice") {
		t.Errorf("args %v and mounts %v: the config file is not where serve looks", c.Args, c.VolumeMounts)
	}
	rep := config.Check("sluice.yaml", []byte(cm.Data["sluice.yaml"]))
	cfg, err := rep.Config, rep.Err()
	if err != nil {
		t.Fatalf("ConfigMap sluice.yaml is not a valid Sluice config:\n%v", err)
	}
	if !strings.HasSuffix(cfg.Listen, fmt.Sprintf(":%d", ports["http"])) || !strings.HasPrefix(cfg.Listen, "0.0.0.0:") {
		t.Errorf("config listens on %q; the container port is %d on every interface", cfg.Listen, ports["http"])
	}
	if dir := filepath.Dir(cfg.Stats.Store); cfg.Stats.Store != "" && !mounts(c, dir) {
		t.Errorf("stats.store %q is on the read-only root filesystem", cfg.Stats.Store)
	}
	checkProbesAnswered(t, cfg, wantPath["liveness"], wantPath["readiness"])
}

func metaSelector(m map[string]string) (labels.Selector, error) {
	if len(m) == 0 {
		return nil, fmt.Errorf("empty selector")
	}
	return labels.SelectorFromSet(m), nil
}

func configMapOf(spec corev1.PodSpec) string {
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	return ""
}

func mounts(c corev1.Container, dir string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir })
}

// checkProbesAnswered starts a router with cfg (workers that are never
// probed) and checks the probe paths are routes, not 404s.
func checkProbesAnswered(t *testing.T, cfg config.Config, paths ...string) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Stats.Store = ""
	cfg.Telemetry.Interval = time.Hour
	srv, err := server.New(cfg, server.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer func() {
		hs.Close()
		srv.Close()
	}()
	for _, p := range paths {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200 from a router whose workers are not yet probed", p, resp.StatusCode)
		}
	}
}

func TestDockerfile_StaticNonRootMultiStage(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	froms := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(text, -1)
	if len(froms) < 2 {
		t.Errorf("%d FROM lines, want a multi-stage build", len(froms))
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "distroless/static", "USER 65532:65532", "-X main.version=", "./cmd/sluice"} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if regexp.MustCompile(`(?m)^USER (root|0)\b`).MatchString(text) {
		t.Error("Dockerfile runs as root")
	}
}

// The chart is rendered here with text/template and the functions its
// templates use, implemented as Helm and sprig define them, so the test
// needs no helm binary.

func renderChart(t *testing.T, overrides map[string]any) []runtime.Object {
	t.Helper()
	const dir = "helm/sluice"
	var chart struct {
		Name, Version, AppVersion string `yaml:"-"`
		RawName                   string `yaml:"name"`
		RawVersion                string `yaml:"version"`
		RawAppVersion             string `yaml:"appVersion"`
		APIVersion                string `yaml:"apiVersion"`
	}
	readYAML(t, filepath.Join(dir, "Chart.yaml"), &chart)
	if chart.APIVersion != "v2" || chart.RawName != "sluice" || chart.RawVersion == "" {
		t.Fatalf("Chart.yaml: %+v", chart)
	}
	var values map[string]any
	readYAML(t, filepath.Join(dir, "values.yaml"), &values)
	merge(values, overrides)

	root := template.New("chart").Option("missingkey=error")
	var tpl *template.Template
	funcs := template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var b bytes.Buffer
			err := tpl.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
		"toYaml": func(v any) (string, error) {
			b, err := yaml.Marshal(v)
			return strings.TrimSuffix(string(b), "\n"), err
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote":      func(v any) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
		"default":    func(d, v any) any { return ifEmpty(v, d) },
		"trunc":      func(n int, s string) string { return s[:min(n, len(s))] },
		"trimSuffix": func(suf, s string) string { return strings.TrimSuffix(s, suf) },
		"sha256sum": func(s string) string {
			h := sha256.Sum256([]byte(s))
			return hex.EncodeToString(h[:])
		},
		"add": func(a, b any) int { return toInt(a) + toInt(b) },
	}
	tpl = root.Funcs(funcs)
	files, err := filepath.Glob(filepath.Join(dir, "templates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	var manifests []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := "sluice/templates/" + filepath.Base(f)
		if _, err := tpl.New(name).Parse(string(data)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if strings.HasSuffix(f, ".yaml") {
			manifests = append(manifests, name)
		}
	}
	ctx := map[string]any{
		"Values":   values,
		"Release":  map[string]any{"Name": "test", "Namespace": "inference", "Service": "Helm"},
		"Chart":    map[string]any{"Name": chart.RawName, "Version": chart.RawVersion, "AppVersion": chart.RawAppVersion},
		"Template": map[string]any{"BasePath": "sluice/templates"},
	}
	var objs []runtime.Object
	for _, name := range append(manifests, "sluice/templates/NOTES.txt") {
		var b bytes.Buffer
		if err := tpl.ExecuteTemplate(&b, name, ctx); err != nil {
			t.Fatalf("render %s: %v", name, err)
		}
		if strings.HasSuffix(name, ".yaml") {
			objs = append(objs, decodeAll(t, name, b.Bytes())...)
		}
	}
	return objs
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// merge sets dst's keys from src, recursing into maps (helm --set).
func merge(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// ifEmpty is sprig's default: d when v is empty (nil, "", 0, false, empty
// collection).
func ifEmpty(v, d any) any {
	if v == nil {
		return d
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String, reflect.Map, reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			return d
		}
	case reflect.Bool:
		if !rv.Bool() {
			return d
		}
	case reflect.Int, reflect.Int64, reflect.Float64:
		if rv.IsZero() {
			return d
		}
	}
	return v
}

func toInt(v any) int {
	switch v := v.(type) {
	case int:
		return v
	case int64:
		return int(v)
	case float64:
		return int(v)
	}
	panic(fmt.Sprintf("add: %T is not a number", v))
}

func TestChart_RendersAWorkingInstall(t *testing.T) {
	objs := renderChart(t, nil)
	checkBundle(t, objs)
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			if got := d.Spec.Template.Spec.Containers[0].Image; got != "sluice:v0.1.0" {
				t.Errorf("image %q, want the appVersion tag", got)
			}
			if got := *d.Spec.Template.Spec.TerminationGracePeriodSeconds; got != 45 {
				t.Errorf("termination grace %d, want graceSeconds + 15", got)
			}
			if len(d.Spec.Template.Annotations["checksum/config"]) != 64 {
				t.Errorf("no config checksum annotation: %v", d.Spec.Template.Annotations)
			}
		}
	}
}

func TestChart_ValuesOverride(t *testing.T) {
	objs := renderChart(t, map[string]any{
		"fullnameOverride": "router",
		"image":            map[string]any{"tag": "v9.9.9"},
		"nodeSelector":     map[string]any{"gpu": "none"},
		"config": map[string]any{"workers": []any{
			map[string]any{"name": "s0", "url": "http://sglang-0.sglang:30000", "kind": "sglang"},
			map[string]any{"name": "t0", "url": "http://tgi-0.tgi:80", "kind": "tgi"},
		}},
	})
	checkBundle(t, objs)
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			spec := d.Spec.Template.Spec
			if d.Name != "router" || spec.Containers[0].Image != "sluice:v9.9.9" || spec.NodeSelector["gpu"] != "none" {
				t.Errorf("overrides not applied: name %q image %q nodeSelector %v", d.Name, spec.Containers[0].Image, spec.NodeSelector)
			}
		}
	}

	// A config Sluice refuses fails the render check, as it would fail
	// the pod.
	bad := renderChart(t, map[string]any{"config": map[string]any{"workers": []any{map[string]any{"name": "x", "url": "ftp://x"}}}})
	for _, o := range bad {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			if err := config.Check("sluice.yaml", []byte(cm.Data["sluice.yaml"])).Err(); err == nil || !strings.Contains(err.Error(), "workers[0].url") {
				t.Errorf("bad config in values: err %v, want one naming workers[0].url", err)
			}
		}
	}
}

func TestStrictDecoding_RefusesUnknownFields(t *testing.T) {
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicass: 2\n"
	if _, _, err := strict.Decode([]byte(doc), nil, nil); err == nil || !strings.Contains(err.Error(), "replicass") {
		t.Errorf("err %v, want one naming the unknown field", err)
	}
	doc = "apiVersion: apps/v2\nkind: Deployment\nmetadata: {name: x}\n"
	if _, _, err := strict.Decode([]byte(doc), nil, nil); err == nil {
		t.Error("unknown apiVersion accepted")
	}
}
