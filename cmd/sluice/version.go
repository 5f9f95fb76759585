package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is set at link time by builds that know it
// (-ldflags "-X main.version=v1.2.3", as deploy/Dockerfile does); when
// empty, the module version from the build info is used.
var version = ""

// buildInfo is what `sluice version` reports.
type buildInfo struct {
	// Version is the module version: a tag such as v0.3.0 for
	// `go install ...@v0.3.0`, "(devel)" for a build from a checkout.
	Version string `json:"version"`
	// Module is the main module's path.
	Module string `json:"module"`
	// Revision, Time and Modified are the VCS commit, its time and
	// whether the tree had local changes; empty when the binary was built
	// without VCS stamping (-buildvcs=false, or outside a checkout).
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified bool   `json:"vcs_modified,omitempty"`
	// Go is the toolchain that built the binary; Platform its GOOS/GOARCH.
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// readBuildInfo gathers buildInfo from the running binary.
func readBuildInfo() buildInfo {
	info, _ := debug.ReadBuildInfo()
	return fromBuildInfo(info)
}

// fromBuildInfo turns the toolchain's build information (nil when the
// binary has none) into buildInfo.
func fromBuildInfo(info *debug.BuildInfo) buildInfo {
	bi := buildInfo{Version: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info != nil {
		bi.Module = info.Main.Path
		if info.Main.Version != "" {
			bi.Version = info.Main.Version
		}
		bi.Go = info.GoVersion
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				bi.Revision = s.Value
			case "vcs.time":
				bi.Time = s.Value
			case "vcs.modified":
				bi.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		bi.Version = version
	}
	return bi
}

// runVersion prints the version and build details.
func runVersion(args []string) error {
	return versionTo(os.Stdout, args)
}

func versionTo(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	bi := readBuildInfo()
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(bi)
	}
	fmt.Fprintf(w, "sluice %s\n", bi.Version)
	if bi.Module != "" {
		fmt.Fprintf(w, "module   %s\n", bi.Module)
	}
	if bi.Revision != "" {
		mod := ""
		if bi.Modified {
			mod = " (modified)"
		}
		fmt.Fprintf(w, "commit   %s%s\n", bi.Revision, mod)
		if bi.Time != "" {
			fmt.Fprintf(w, "built    %s\n", bi.Time)
		}
	}
	fmt.Fprintf(w, "go       %s %s\n", bi.Go, bi.Platform)
	return nil
}
