// Package deploy holds Sluice's container image recipe (Dockerfile), plain
// Kubernetes manifests (kubernetes/) and a Helm chart (helm/sluice). It has
// no code: its tests parse every manifest and the rendered chart against
// the Kubernetes API types and check that probes, ports and selectors fit
// together and that the embedded Sluice config is valid.
package deploy
