package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/discovery/discoverytest"
)

// fakeSink records what the Watcher does and reports each call on events.
type fakeSink struct {
	mu      sync.Mutex
	workers map[string]config.Worker
	events  chan string
	failAdd map[string]bool
}

func newSink() *fakeSink {
	return &fakeSink{workers: map[string]config.Worker{}, events: make(chan string, 100), failAdd: map[string]bool{}}
}

func (s *fakeSink) AddWorker(w config.Worker) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failAdd[w.Name] {
		s.events <- "fail " + w.Name
		return errors.New("refused")
	}
	if _, ok := s.workers[w.Name]; ok {
		return fmt.Errorf("worker %q already exists", w.Name)
	}
	s.workers[w.Name] = w
	s.events <- "add " + w.Name + " " + w.URL
	return nil
}

func (s *fakeSink) RemoveWorker(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.workers[name]; !ok {
		return fmt.Errorf("no worker %q", name)
	}
	delete(s.workers, name)
	s.events <- "remove " + name
	return nil
}

func (s *fakeSink) WorkerNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.workers {
		out = append(out, n)
	}
	return out
}

func (s *fakeSink) get(name string) config.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers[name]
}

// drop removes a worker behind the Watcher's back, as a config reload does.
func (s *fakeSink) drop(name string) {
	s.mu.Lock()
	delete(s.workers, name)
	s.mu.Unlock()
}

// expect waits for the next events and compares them, in any order.
func (s *fakeSink) expect(t *testing.T, want ...string) {
	t.Helper()
	var got []string
	deadline := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case e := <-s.events:
			got = append(got, e)
		case <-deadline:
			t.Fatalf("got events %q, want %q", got, want)
		}
	}
	sort.Strings(got)
	want = slices.Clone(want)
	sort.Strings(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

// slice builds an EndpointSlice of the vllm Service with endpoints given
// as pod=ip, a "!" before the pod marking it not ready.
func slice(name string, port int32, eps ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "inference",
			Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port)}, {Name: ptr("metrics"), Port: ptr(int32(9090))}},
	}
	for _, e := range eps {
		pod, ip, _ := strings.Cut(e, "=")
		readyNow := !strings.HasPrefix(pod, "!")
		pod = strings.TrimPrefix(pod, "!")
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(readyNow)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "inference"},
		})
	}
	return s
}

var testCfg = config.KubernetesDiscovery{
	Namespace: "inference", Selector: "kubernetes.io/service-name=vllm", PortName: "http",
	Kind: "vllm", Models: []string{"llama"}, MaxConcurrency: 8,
}

func start(t *testing.T, objs ...*discoveryv1.EndpointSlice) (discoverytest.Client, *fakeSink, *Watcher) {
	t.Helper()
	client := discoverytest.New(t)
	for _, o := range objs {
		if _, err := client.EndpointSlices(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sink := newSink()
	w, err := New(testCfg, client, sink, Options{Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := w.Run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	return client, sink, w
}

func TestWatcher_SlicesAddedChangedRemoved(t *testing.T) {
	client, sink, w := start(t, slice("vllm-abc", 8000, "vllm-0=10.0.0.1", "!vllm-1=10.0.0.2"))
	sink.expect(t, "add vllm-0 http://10.0.0.1:8000")
	if got := sink.get("vllm-0"); got.Kind != "vllm" || got.MaxConcurrency != 8 || !slices.Equal(got.Models, []string{"llama"}) {
		t.Errorf("worker %+v: want kind, models and max_concurrency from the config", got)
	}

	// vllm-1 becomes ready, vllm-0 moves to another address.
	ctx := context.Background()
	if _, err := client.EndpointSlices("inference").Update(ctx, slice("vllm-abc", 8000, "vllm-0=10.0.0.9", "vllm-1=10.0.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "add vllm-1 http://10.0.0.2:8000", "remove vllm-0", "add vllm-0 http://10.0.0.9:8000")

	// A second slice of the same Service adds its endpoints.
	if _, err := client.EndpointSlices("inference").Create(ctx, slice("vllm-def", 8000, "vllm-2=10.0.1.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "add vllm-2 http://10.0.1.1:8000")

	// The first slice goes away: its workers are removed, the other stays.
	if err := client.EndpointSlices("inference").Delete(ctx, "vllm-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "remove vllm-0", "remove vllm-1")
	if diff := cmp.Diff([]string{"vllm-2"}, owned(w)); diff != "" {
		t.Errorf("owned (-want +got):\n%s", diff)
	}
}

func TestWatcher_OtherServicesAndNamespacesIgnored(t *testing.T) {
	other := slice("tgi-xyz", 80, "tgi-0=10.0.2.1")
	other.Labels[discoveryv1.LabelServiceName] = "tgi"
	elsewhere := slice("vllm-zzz", 8000, "vllm-9=10.0.3.1")
	elsewhere.Namespace = "staging"
	_, sink, w := start(t, other, elsewhere, slice("vllm-abc", 8000, "vllm-0=10.0.0.1"))
	sink.expect(t, "add vllm-0 http://10.0.0.1:8000")
	if diff := cmp.Diff([]string{"vllm-0"}, owned(w)); diff != "" {
		t.Errorf("owned (-want +got):\n%s", diff)
	}
}

func TestWatcher_ResyncReaddsWhatAReloadDropped(t *testing.T) {
	client := discoverytest.New(t)
	sink := newSink()
	w, err := New(testCfg, client, sink, Options{Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	set := func() map[string]config.Worker {
		return desiredWorkers(testCfg, []*discoveryv1.EndpointSlice{slice("vllm-abc", 8000, "vllm-0=10.0.0.1")})
	}
	w.reconcile(set(), false)
	sink.expect(t, "add vllm-0 http://10.0.0.1:8000")
	// Without a full pass, a worker the Watcher owns is not re-added.
	sink.drop("vllm-0")
	w.reconcile(set(), false)
	select {
	case e := <-sink.events:
		t.Errorf("unexpected event %q", e)
	default:
	}
	// The periodic full pass puts it back.
	w.reconcile(set(), true)
	sink.expect(t, "add vllm-0 http://10.0.0.1:8000")
}

func TestWatcher_RefusedAddIsRetriedOnNextChange(t *testing.T) {
	sink := newSink()
	sink.failAdd["vllm-0"] = true
	w, err := New(testCfg, discoverytest.New(t), sink, Options{Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	set := desiredWorkers(testCfg, []*discoveryv1.EndpointSlice{slice("a", 8000, "vllm-0=10.0.0.1")})
	w.reconcile(set, false)
	sink.expect(t, "fail vllm-0")
	sink.mu.Lock()
	sink.failAdd["vllm-0"] = false
	sink.mu.Unlock()
	w.reconcile(set, false)
	sink.expect(t, "add vllm-0 http://10.0.0.1:8000")
}

func TestDesired_PortsNamesAndConditions(t *testing.T) {
	s := slice("svc-abc", 8000, "p0=10.0.0.1")
	// An endpoint without a pod (Ready unset: ready), and one terminating.
	s.Endpoints = append(s.Endpoints,
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.7"}},
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.8"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Terminating: ptr(true)}},
	)
	v6 := slice("svc-v6", 8000, "p0=fd00::1")
	v6.AddressType = discoveryv1.AddressTypeIPv6

	got := desiredWorkers(testCfg, []*discoveryv1.EndpointSlice{v6, s})
	var urls []string
	for _, w := range got {
		urls = append(urls, w.Name+" "+w.URL)
	}
	sort.Strings(urls)
	want := []string{"p0 http://10.0.0.1:8000", "svc-abc-10-0-0-7 http://10.0.0.7:8000"}
	if diff := cmp.Diff(want, urls); diff != "" {
		t.Errorf("workers (-want +got):\n%s", diff)
	}

	// No port name and two ports: ambiguous, the slice is skipped.
	cfg := testCfg
	cfg.PortName = ""
	if got := desiredWorkers(cfg, []*discoveryv1.EndpointSlice{slice("x", 8000, "p=10.0.0.1")}); len(got) != 0 {
		t.Errorf("ambiguous port: %v", got)
	}
	// A single port needs no name; IPv6 addresses are bracketed.
	one := slice("y", 8000, "p=fd00::2")
	one.Ports = one.Ports[:1]
	if got := desiredWorkers(cfg, []*discoveryv1.EndpointSlice{one}); got["p"].URL != "http://[fd00::2]:8000" {
		t.Errorf("single port: %v", got)
	}
}

func TestNew_Validation(t *testing.T) {
	sink := newSink()
	client := discoverytest.New(t)
	for _, tt := range []struct {
		cfg  config.KubernetesDiscovery
		want string
	}{
		{config.KubernetesDiscovery{Namespace: "n", Selector: "a in (b"}, "discovery.kubernetes.selector"},
		{config.KubernetesDiscovery{Namespace: "n", Selector: ""}, "selects everything"},
		{config.KubernetesDiscovery{Selector: "app=x"}, "discovery.kubernetes.namespace"},
	} {
		if _, err := New(tt.cfg, client, sink, Options{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v): err %v, want %q", tt.cfg, err, tt.want)
		}
	}
	w, err := New(config.KubernetesDiscovery{Selector: "app=x"}, client, sink, Options{Namespace: "own"})
	if err != nil || w.cfg.Namespace != "own" {
		t.Errorf("defaults: %v %+v", err, w)
	}
	// The kind defaults when the workers are made (desiredWorkers).
	cfg := w.cfg
	cfg.PortName = "http"
	got := desiredWorkers(cfg, []*discoveryv1.EndpointSlice{slice("s", 8000, "p1=10.0.0.1")})
	if len(got) != 1 {
		t.Fatalf("desiredWorkers: %v, want one worker", got)
	}
	for _, wk := range got {
		if wk.Kind != "llamacpp" {
			t.Errorf("kind %q by default, want llamacpp", wk.Kind)
		}
	}
}

// owned returns the workers w has added and not removed, by name.
func owned(w *Watcher) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := make([]string, 0, len(w.owned))
	for n := range w.owned {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
