// Package discovery finds workers at run time instead of (or besides) the
// config's static list. Kubernetes is the one source: a Watcher follows the
// EndpointSlices that match a label selector and turns their ready
// endpoints into workers, added and removed through the same path as the
// admin API (a Sink, which *server.Server satisfies through a small
// adapter).
//
// # Concurrency Model
//
// A Watcher runs one client-go informer, of EndpointSlices only: it needs
// the typed client of the discovery.k8s.io group, not the whole clientset
// and informer factory, whose hundreds of API groups would be compiled and
// linked into the binary for nothing. Its event handlers only mark the
// desired set dirty; a single reconcile goroutine recomputes the set from
// the informer's cache and applies the difference to the Sink, so Sink calls
// never run concurrently and never block the informer. The same goroutine
// re-applies the whole set every Resync, which re-adds workers a config
// reload removed.
//
// Nothing here is on the request path: the scheduler sees discovered
// workers exactly as it sees configured ones.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/fleet"
)

// Log keys, constant so logs can be queried.
const (
	keyWorker    = "worker"
	keyURL       = "url"
	keyNamespace = "namespace"
	keySelector  = "selector"
	keyErr       = "err"
)

// Sink receives the discovered workers: the server's admin path.
type Sink interface {
	// AddWorker adds a worker; it fails for a name already present.
	AddWorker(config.Worker) error
	// RemoveWorker removes a worker; its requests in flight finish.
	RemoveWorker(name string) error
	// WorkerNames lists the workers present now, discovered or not.
	WorkerNames() []string
}

// Options configure a Watcher.
type Options struct {
	// Logger receives discovery's logs; nil discards them.
	Logger *slog.Logger
	// Resync is how often the whole discovered set is re-applied to the
	// Sink (and the informer re-lists); 0 means 30 seconds.
	Resync time.Duration
	// Namespace is used when the config leaves it empty; ServiceAccount
	// tokens mount it at /var/run/secrets/kubernetes.io/serviceaccount.
	Namespace string
}

// Watcher follows EndpointSlices and keeps the Sink's discovered workers
// equal to their ready endpoints.
type Watcher struct {
	cfg    config.KubernetesDiscovery
	client discoveryclient.EndpointSlicesGetter
	sink   Sink
	log    *slog.Logger
	resync time.Duration
	sel    labels.Selector

	dirty chan struct{}

	mu    sync.Mutex
	owned map[string]config.Worker // workers this Watcher added, by name
}

// ParseSelector checks a label selector's syntax. Its error is a
// *config.Problem naming the key, so sluice config check reports it on
// its line with the file's other problems.
func ParseSelector(s string) (labels.Selector, error) {
	const key = "discovery.kubernetes.selector"
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, &config.Problem{Key: key, Msg: fmt.Sprintf("%q: %v", s, err)}
	}
	if sel.Empty() {
		return nil, &config.Problem{Key: key, Msg: fmt.Sprintf("%q selects everything", s)}
	}
	return sel, nil
}

// inClusterNamespaceFile is where Kubernetes mounts the pod's namespace.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// OwnNamespace returns the namespace the process runs in, or "" outside a
// pod.
func OwnNamespace() string {
	b, err := os.ReadFile(inClusterNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// New returns a Watcher for cfg that reads EndpointSlices through client
// (discoveryclient.NewForConfig, or its fake in tests). It fails on a
// selector that does not parse or when no namespace is known.
func New(cfg config.KubernetesDiscovery, client discoveryclient.EndpointSlicesGetter, sink Sink, opts Options) (*Watcher, error) {
	sel, err := ParseSelector(cfg.Selector)
	if err != nil {
		return nil, err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = opts.Namespace
	}
	if cfg.Namespace == "" {
		return nil, errors.New("discovery.kubernetes.namespace: empty, and the router's own namespace is unknown (not in a pod)")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	resync := opts.Resync
	if resync <= 0 {
		resync = 30 * time.Second
	}
	return &Watcher{
		cfg: cfg, client: client, sink: sink, sel: sel, resync: resync,
		log:   log.With(slog.String(keyNamespace, cfg.Namespace), slog.String(keySelector, cfg.Selector)),
		dirty: make(chan struct{}, 1),
		owned: map[string]config.Worker{},
	}, nil
}

// Run watches until ctx ends. It returns once the informer has synced and
// the first set is applied (ready reports that moment when not nil), or
// with an error if the first sync fails; the watch goes on in the
// background until ctx ends. On ctx's end the discovered workers are left
// in place: the process is stopping.
func (w *Watcher) Run(ctx context.Context, ready func()) error {
	endpointSlices := w.client.EndpointSlices(w.cfg.Namespace)
	selector := w.sel.String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return endpointSlices.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return endpointSlices.Watch(ctx, o)
		},
	}
	// As the generated informers do: the client says whether it serves
	// watch-list streams (client-go's fakes do not).
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, w.client), &discoveryv1.EndpointSlice{}, w.resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	mark := func(any) { w.markDirty() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, n any) { mark(n) },
		DeleteFunc: mark,
	}); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	lister := discoverylisters.NewEndpointSliceLister(inf.GetIndexer())
	var running sync.WaitGroup
	running.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		running.Wait()
		return fmt.Errorf("discovery: endpointslices informer did not sync: %w", context.Cause(ctx))
	}
	w.log.Info("discovery watching endpointslices")
	apply := func(all bool) {
		eps, err := lister.EndpointSlices(w.cfg.Namespace).List(w.sel)
		if err != nil {
			w.log.Error("discovery list", slog.String(keyErr, err.Error()))
			return
		}
		w.reconcile(desiredWorkers(w.cfg, eps), all)
	}
	apply(true)
	if ready != nil {
		ready()
	}
	go func() {
		t := time.NewTicker(w.resync)
		defer t.Stop()
		defer running.Wait() // the informer stops with ctx
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.dirty:
				apply(false)
			case <-t.C:
				apply(true)
			}
		}
	}()
	return nil
}

func (w *Watcher) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// reconcile applies desired to the Sink: workers gone or changed are
// removed, new or changed ones added. With all, workers this Watcher
// owns but the Sink no longer has (a config reload dropped them) are
// added again.
func (w *Watcher) reconcile(desired map[string]config.Worker, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	present := map[string]bool{}
	if all {
		for _, n := range w.sink.WorkerNames() {
			present[n] = true
		}
	}
	for name, have := range w.owned {
		want, ok := desired[name]
		if ok && equal(have, want) {
			continue
		}
		if err := w.sink.RemoveWorker(name); err != nil {
			w.log.Warn("discovery remove worker", slog.String(keyWorker, name), slog.String(keyErr, err.Error()))
		} else {
			w.log.Info("discovered worker removed", slog.String(keyWorker, name), slog.String(keyURL, have.URL))
		}
		delete(w.owned, name)
	}
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		want := desired[name]
		if _, ok := w.owned[name]; ok && (!all || present[name]) {
			continue
		}
		if err := w.sink.AddWorker(want); err != nil {
			w.log.Warn("discovery add worker", slog.String(keyWorker, name), slog.String(keyURL, want.URL), slog.String(keyErr, err.Error()))
			continue
		}
		w.owned[name] = want
		w.log.Info("discovered worker added", slog.String(keyWorker, name), slog.String(keyURL, want.URL))
	}
}

func equal(a, b config.Worker) bool {
	return a.Name == b.Name && a.URL == b.URL && a.Kind == b.Kind &&
		slices.Equal(a.Models, b.Models) && a.MaxConcurrency == b.MaxConcurrency
}

// desiredWorkers computes the workers the slices describe: one per ready
// endpoint (Ready unset counts as ready, as the API says consumers should
// read it), on the port named cfg.PortName (or the slice's only port),
// named after the endpoint's pod. Endpoints that are not ready, or
// terminating, are left out, so a pod going away stops receiving new
// requests while its requests in flight finish.
func desiredWorkers(cfg config.KubernetesDiscovery, eps []*discoveryv1.EndpointSlice) map[string]config.Worker {
	kind := cfg.Kind
	if kind == "" {
		kind = fleet.KindLlamaCPP
	}
	slices.SortFunc(eps, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	out := map[string]config.Worker{}
	for _, s := range eps {
		port, ok := slicePort(s, cfg.PortName)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if !ready(ep) || len(ep.Addresses) == 0 {
				continue
			}
			addr := ep.Addresses[0]
			name := endpointName(s, ep, addr)
			if _, dup := out[name]; dup {
				continue // the same pod in the IPv4 and IPv6 slices: the first wins
			}
			out[name] = config.Worker{
				Name:           name,
				URL:            "http://" + net.JoinHostPort(addr, strconv.Itoa(int(port))),
				Kind:           kind,
				Models:         cfg.Models,
				MaxConcurrency: cfg.MaxConcurrency,
			}
		}
	}
	return out
}

func ready(ep discoveryv1.Endpoint) bool {
	c := ep.Conditions
	if c.Terminating != nil && *c.Terminating {
		return false
	}
	return c.Ready == nil || *c.Ready
}

// slicePort returns the slice's port named name, or its only port when
// name is empty.
func slicePort(s *discoveryv1.EndpointSlice, name string) (int32, bool) {
	var found []discoveryv1.EndpointPort
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		pn := ""
		if p.Name != nil {
			pn = *p.Name
		}
		if name == "" || pn == name {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return 0, false
	}
	return *found[0].Port, true
}

// endpointName is the pod's name when the endpoint targets a pod, else the
// slice's name and the address.
func endpointName(s *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, addr string) string {
	if r := ep.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
		return r.Name
	}
	return s.Name + "-" + strings.NewReplacer(".", "-", ":", "-").Replace(addr)
}
