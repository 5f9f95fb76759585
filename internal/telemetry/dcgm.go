package telemetry

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Metric and label names of NVIDIA's dcgm-exporter (etc/default-counters.csv
// of NVIDIA/dcgm-exporter): GPU utilisation in percent 0..100, and frame
// buffer memory used and free in MiB. Each series is labelled with gpu (the
// index), UUID, device (nvidiaN), modelName, Hostname and, in newer
// releases, pci_bus_id and DCGM_FI_DRIVER_VERSION; on Kubernetes also
// container, namespace and pod.
const (
	DCGMGPUUtil = "DCGM_FI_DEV_GPU_UTIL"
	DCGMFBUsed  = "DCGM_FI_DEV_FB_USED"
	DCGMFBFree  = "DCGM_FI_DEV_FB_FREE"

	// DCGMLabelGPU is the GPU index label.
	DCGMLabelGPU = "gpu"
	// DCGMLabelUUID is the GPU UUID label.
	DCGMLabelUUID = "UUID"
)

// GPUMetrics is what dcgm-exporter says about one GPU.
type GPUMetrics struct {
	// Util is the GPU's utilisation as a fraction 0..1 (the exporter
	// reports percent).
	Util Value `json:"util"`
	// FBUsedMiB and FBFreeMiB are frame buffer memory used and free.
	FBUsedMiB Value `json:"fb_used_mib"`
	FBFreeMiB Value `json:"fb_free_mib"`
	// Labels are the labels of the GPU's DCGM_FI_DEV_GPU_UTIL series
	// (gpu, UUID, modelName, ...), to say which GPU was read.
	Labels map[string]string `json:"labels,omitempty"`
}

// Selector picks one GPU by its labels, e.g. {"gpu": "1"} or
// {"UUID": "GPU-..."}: a series matches when it has every label with the
// given value. An empty Selector matches any series.
type Selector map[string]string

func (sel Selector) matches(labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// String renders the selector as {k="v",...} in key order.
func (sel Selector) String() string {
	keys := slices.Sorted(maps.Keys(sel))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, sel[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// gpuID names the physical GPU a series is about: its UUID, else its index.
func gpuID(labels map[string]string) string {
	if u := labels[DCGMLabelUUID]; u != "" {
		return u
	}
	return labels[DCGMLabelGPU]
}

// ParseDCGM reads dcgm-exporter's /metrics and returns the GPU sel picks.
//
// The GPU is chosen on DCGM_FI_DEV_GPU_UTIL: the series matching sel must
// all be one GPU (same UUID, or same gpu index when there is no UUID;
// several series per GPU happen on Kubernetes, one per pod, and carry the
// same value). An empty sel works when the exporter serves one GPU. No
// match, or a match of several GPUs, is an error naming the GPUs there
// are. The memory metrics are then read from that GPU's series.
//
// Malformed text returns an error wrapping ErrMalformed. Absent metrics
// return the partial GPUMetrics and a *MissingError.
func ParseDCGM(r io.Reader, sel Selector) (GPUMetrics, error) {
	return parseProm(r, "dcgm", func(mfs familyMap, miss *missing) (GPUMetrics, error) {
		g := GPUMetrics{
			Util:      Value{Metric: DCGMGPUUtil},
			FBUsedMiB: Value{Metric: DCGMFBUsed},
			FBFreeMiB: Value{Metric: DCGMFBFree},
		}
		util, ok := samples(mfs, DCGMGPUUtil)
		if !ok {
			// Without the utilisation series, pick the GPU on memory.
			util, ok = samples(mfs, DCGMFBUsed)
			if !ok {
				util, _ = samples(mfs, DCGMFBFree)
			}
		}
		if len(util) == 0 {
			miss.add("%s", DCGMGPUUtil)
			miss.add("%s", DCGMFBUsed)
			miss.add("%s", DCGMFBFree)
			return g, nil
		}
		var chosen []sample
		ids := map[string]bool{}
		for _, s := range util {
			if sel.matches(s.labels) {
				chosen = append(chosen, s)
				ids[gpuID(s.labels)] = true
			}
		}
		switch {
		case len(chosen) == 0:
			return g, fmt.Errorf("no GPU matches %s (GPUs: %s)", sel, describeGPUs(util))
		case len(ids) > 1:
			return g, fmt.Errorf("%s matches %d GPUs (GPUs: %s); select one by %s or %s",
				sel, len(ids), describeGPUs(chosen), DCGMLabelGPU, DCGMLabelUUID)
		}
		id := gpuID(chosen[0].labels)
		g.Labels = chosen[0].labels
		sameGPU := func(s sample) bool { return sel.matches(s.labels) && gpuID(s.labels) == id }
		g.Util = aggregate(mfs, DCGMGPUUtil, sameGPU, func(vs []float64) float64 { return clamp01(vs[0] / 100) }, miss)
		g.FBUsedMiB = aggregate(mfs, DCGMFBUsed, sameGPU, first, miss)
		g.FBFreeMiB = aggregate(mfs, DCGMFBFree, sameGPU, first, miss)
		return g, nil
	})
}

func first(vs []float64) float64 { return max(vs[0], 0) }

// describeGPUs lists the GPUs of some series as gpu=N/UUID.
func describeGPUs(ss []sample) string {
	var out []string
	for _, s := range ss {
		d := fmt.Sprintf("%s=%q", DCGMLabelGPU, s.labels[DCGMLabelGPU])
		if u := s.labels[DCGMLabelUUID]; u != "" {
			d += fmt.Sprintf(" %s=%q", DCGMLabelUUID, u)
		}
		out = append(out, d)
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), ", ")
}
