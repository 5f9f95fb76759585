// Package discoverytest gives tests a fake discovery.k8s.io client: an
// object tracker of EndpointSlices behind client-go's fake, which the
// discovery Watcher lists and watches as it would a cluster's API server.
// Tests of the watcher (package discovery) and of a router following it
// (package server) share it; nothing else imports it.
package discoverytest

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	fakediscovery "k8s.io/client-go/kubernetes/typed/discovery/v1/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Client is client-go's fake of the discovery.k8s.io client. Like the
// generated fake clientset it tells the informer it serves no watch-list
// streams, so the informer lists, then watches.
type Client struct{ *fakediscovery.FakeDiscoveryV1 }

// IsWatchListSemanticsUnSupported reports that the fake serves no
// watch-list streams.
func (Client) IsWatchListSemanticsUnSupported() bool { return true }

// New returns a Client backed by an empty object tracker of
// EndpointSlices, as the generated fake clientset builds one per group:
// create, update and delete slices through it and a watcher sees them.
func New(t testing.TB) Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	tracker := k8stesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	f := &k8stesting.Fake{}
	f.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))
	f.AddWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		return err == nil, w, err
	})
	return Client{&fakediscovery.FakeDiscoveryV1{Fake: f}}
}
