package apiserver

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNoBinaries reports that etcd or kube-apiserver has not been built; run
// test/cluster/build-binaries.sh.
var ErrNoBinaries = errors.New("kubernetes binaries not built (run test/cluster/build-binaries.sh)")

// Binaries are the paths of the programs an Env runs.
type Binaries struct {
	Etcd          string
	KubeAPIServer string
	Kubectl       string
	// Dir holds every Kubernetes component build-binaries.sh builds
	// (kube-apiserver, kubectl, kubelet, ...), for the end-to-end harness.
	Dir string
}

// FindBinaries locates the binaries test/cluster/build-binaries.sh built for
// the versions in test/cluster/versions.env, found by walking up from the
// working directory to the module root. It wraps ErrNoBinaries when they are
// missing.
func FindBinaries() (Binaries, error) {
	root, err := moduleRoot()
	if err != nil {
		return Binaries{}, err
	}
	versions, err := readEnvFile(filepath.Join(root, "test", "cluster", "versions.env"))
	if err != nil {
		return Binaries{}, err
	}
	k8s, etcd := versions["KUBERNETES_VERSION"], versions["ETCD_VERSION"]
	if k8s == "" || etcd == "" {
		return Binaries{}, fmt.Errorf("read versions.env: KUBERNETES_VERSION or ETCD_VERSION missing")
	}
	// The same default as build-binaries.sh.
	cache := os.Getenv("SOCKMESH_CACHE")
	if cache == "" {
		cache = "/var/cache/sockmesh"
	}
	b := Binaries{
		Etcd: filepath.Join(cache, "etcd", etcd, "bin", "etcd"),
		Dir:  filepath.Join(cache, "k8s", k8s, "bin"),
	}
	b.KubeAPIServer = filepath.Join(b.Dir, "kube-apiserver")
	b.Kubectl = filepath.Join(b.Dir, "kubectl")
	for _, p := range []string{b.Etcd, b.KubeAPIServer, b.Kubectl} {
		if _, err := os.Stat(p); err != nil {
			return Binaries{}, fmt.Errorf("%w: %w", ErrNoBinaries, err)
		}
	}
	return b, nil
}

const modulePath = "github.com/sockmesh/sockmesh"

// moduleRoot finds the directory of sockmesh's go.mod above the working
// directory (tests run in their package directory, `go run` in the root).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains("\n"+string(data), "\nmodule "+modulePath+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: no go.mod of %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// readEnvFile parses KEY=VALUE lines, skipping blanks and # comments.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	vars := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("read %s: malformed line %q", path, line)
		}
		vars[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return vars, nil
}
