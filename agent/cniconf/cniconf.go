package cniconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// PluginType is the plugin's type in a conflist, and its binary's name.
const PluginType = "sockmesh-cni"

// ErrNoNetwork is returned by Install when the conf directory holds no
// network configuration yet: the node's network plugin has not written
// its own (it may, later).
var ErrNoNetwork = errors.New("no CNI network configuration")

// InstallBinary puts the plugin binary src into binDir, as PluginType.
func InstallBinary(src, binDir string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open the sockmesh-cni binary to install: %w", err)
	}
	defer in.Close()
	// By rename: a plugin being run keeps the file it runs.
	return writeFrom(filepath.Join(binDir, PluginType), in, 0o755)
}

// Chain puts the plugin's entry, last, in the network configuration of
// confDir the runtime uses, and returns that file's path. entry holds the
// entry's fields besides its type: socket, timeout, exemptNamespaces (see
// cmd/sockmesh-cni). A file that holds the entry as wanted is not written.
func Chain(confDir string, entry map[string]any) (string, error) {
	path, err := networkFile(confDir)
	if err != nil {
		return "", err
	}
	e := map[string]any{"type": PluginType}
	for k, v := range entry {
		e[k] = v
	}
	raw, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("encode the sockmesh-cni entry: %w", err)
	}
	return path, edit(path, func(plugins []json.RawMessage) []json.RawMessage {
		return append(withoutOurs(plugins), raw)
	})
}

// Uninstall removes the entry from every network configuration in confDir
// and the binary from binDir; what is not there is no error.
func Uninstall(confDir, binDir string) error {
	files, err := networkFiles(confDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		errs = append(errs, edit(f, withoutOurs))
	}
	if err := os.Remove(filepath.Join(binDir, PluginType)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove the sockmesh-cni binary: %w", err))
	}
	return errors.Join(errs...)
}

// networkFiles lists confDir's network configurations in the order libcni
// (ConfFiles) and the runtimes using it take them: by name.
func networkFiles(confDir string) ([]string, error) {
	ents, err := os.ReadDir(confDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the CNI conf directory: %w", err)
	}
	var out []string
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && slices.Contains([]string{".conf", ".conflist", ".json"}, ext) {
			out = append(out, filepath.Join(confDir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// networkFile is the network configuration the runtime uses: the first.
func networkFile(confDir string) (string, error) {
	files, err := networkFiles(confDir)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("%w in %s", ErrNoNetwork, confDir)
	}
	return files[0], nil
}

// edit rewrites path's plugin list with change, keeping every other field;
// a file change leaves as it was is not written.
func edit(path string, change func([]json.RawMessage) []json.RawMessage) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read CNI network configuration: %w", err)
	}
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(data, &conf); err != nil {
		return fmt.Errorf("parse CNI network configuration %s: %w", path, err)
	}
	rawPlugins, ok := conf["plugins"]
	if !ok {
		// A single-plugin .conf: the runtime reads no list from it.
		return fmt.Errorf("CNI network configuration %s has no plugin list: make it a .conflist to chain sockmesh-cni", path)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(rawPlugins, &plugins); err != nil {
		return fmt.Errorf("parse the plugin list of %s: %w", path, err)
	}
	changed := change(plugins)
	if equalJSON(changed, plugins) {
		return nil
	}
	if conf["plugins"], err = json.Marshal(changed); err != nil {
		return err
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, append(out, '\n'))
}

// withoutOurs drops sockmesh-cni's entries.
func withoutOurs(plugins []json.RawMessage) []json.RawMessage {
	return slices.DeleteFunc(slices.Clone(plugins), func(p json.RawMessage) bool {
		var e struct {
			Type string `json:"type"`
		}
		return json.Unmarshal(p, &e) == nil && e.Type == PluginType
	})
}

// equalJSON compares plugin lists by their compacted JSON.
func equalJSON(a, b []json.RawMessage) bool {
	return slices.EqualFunc(a, b, func(x, y json.RawMessage) bool {
		var cx, cy bytes.Buffer
		return json.Compact(&cx, x) == nil && json.Compact(&cy, y) == nil && bytes.Equal(cx.Bytes(), cy.Bytes())
	})
}

// writeFile replaces path with data, keeping its mode.
func writeFile(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	return writeFrom(path, bytes.NewReader(data), mode)
}

// writeFrom replaces path with what r reads. The temporary file's name
// ends in neither .conf, .conflist nor .json: no runtime takes it.
func writeFrom(path string, r io.Reader, mode os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := errors.Join(tmp.Chmod(mode), tmp.Sync(), tmp.Close()); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
