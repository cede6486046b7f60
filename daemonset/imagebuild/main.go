// Command imagebuild writes a one-layer container image holding static
// binaries as a docker-archive tarball, loadable with
// `ctr -n k8s.io images import` (see daemonset/image). It needs no Docker
// engine and no registry.
//
//	CGO_ENABLED=0 go build -o bin/ ./cmd/sockmesh ./cmd/sockmesh-cni
//	go run ./daemonset/imagebuild -tag localhost/sockmesh:dev -o sockmesh.tar bin/sockmesh=/sockmesh bin/sockmesh-cni=/sockmesh-cni
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/sockmesh/sockmesh/daemonset/image"
)

func main() {
	tag := flag.String("tag", "localhost/sockmesh:dev", "image reference (use localhost/... with imagePullPolicy: Never)")
	out := flag.String("o", "", "output tarball path (required)")
	entrypoint := flag.String("entrypoint", "", "entrypoint path inside the image (default: the first file)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: imagebuild -o OUT.tar [flags] HOSTPATH=/IMAGE/PATH...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	spec := image.Spec{Tag: *tag}
	if *entrypoint != "" {
		spec.Entrypoint = []string{*entrypoint}
	}
	for _, a := range flag.Args() {
		f, err := image.ParseFile(a)
		if err != nil {
			fmt.Fprintln(os.Stderr, "imagebuild:", err)
			os.Exit(2)
		}
		spec.Files = append(spec.Files, f)
	}
	if err := image.Write(*out, spec); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}
