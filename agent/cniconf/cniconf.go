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
	"strings"
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
// A single plugin's configuration (a .conf) has no list to chain into: it
// becomes a .conflist of the same name, that plugin first, as libcni
// reads a .conf (ConfListFromConf), with its name and cniVersion; the
// .conflist names the file it replaced (convertedFrom), for Uninstall to
// put it back.
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
	conf, err := read(path)
	if err != nil {
		return "", err
	}
	if _, ok := conf["plugins"]; !ok {
		return convert(path, conf, raw)
	}
	return path, edit(path, func(plugins []json.RawMessage) []json.RawMessage {
		return append(withoutOurs(plugins), raw)
	})
}

// convertedFrom is the key of a .conflist Chain made of a single plugin's
// configuration: the name of the file it replaced.
const convertedFrom = "sockmeshConvertedFrom"

// convert replaces the single plugin's configuration conf at path by a
// .conflist of the same name listing it, then entry, and returns its path.
// The .conflist is written first: until the .conf goes, the runtime still
// uses the .conf (it sorts first), never neither.
func convert(path string, conf map[string]json.RawMessage, entry json.RawMessage) (string, error) {
	if _, ok := conf["type"]; !ok {
		return "", fmt.Errorf("CNI network configuration %s has neither a plugin list nor a plugin type", path)
	}
	plugin, err := json.Marshal(conf)
	if err != nil {
		return "", err
	}
	list := map[string]json.RawMessage{"plugins": nil, convertedFrom: nil}
	for _, k := range []string{"name", "cniVersion"} {
		if v, ok := conf[k]; ok {
			list[k] = v
		}
	}
	if list["plugins"], err = json.Marshal([]json.RawMessage{plugin, entry}); err != nil {
		return "", err
	}
	if list[convertedFrom], err = json.Marshal(filepath.Base(path)); err != nil {
		return "", err
	}
	target := strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	// One there already is the network plugin's, shadowed by the .conf,
	// unless Chain made it of an earlier .conf of that name.
	if old, err := read(target); err == nil {
		var from string
		if json.Unmarshal(old[convertedFrom], &from) != nil || from != filepath.Base(path) {
			return "", fmt.Errorf("cannot make CNI network configuration %s a .conflist: %s exists", path, target)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return "", err
	}
	if err := writeFile(target, append(out, '\n'), path); err != nil {
		return "", err
	}
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("remove %s, now %s: %w", path, target, err)
	}
	return target, nil
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
		errs = append(errs, unchain(f))
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
		if !e.IsDir() && isNetworkFile(e.Name()) {
			out = append(out, filepath.Join(confDir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// isNetworkFile reports whether name is a network configuration's, to
// libcni: a plain file name with one of its extensions.
func isNetworkFile(name string) bool {
	return name == filepath.Base(name) && slices.Contains([]string{".conf", ".conflist", ".json"}, filepath.Ext(name))
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

// unchain removes sockmesh-cni's entry from the network configuration at
// path; a .conflist Chain made of a single plugin's configuration becomes
// that again, under its name (unless the network plugin wrote one there
// since, which the runtime uses).
func unchain(path string) error {
	conf, err := read(path)
	if err != nil {
		return err
	}
	var from string
	if raw, ok := conf[convertedFrom]; !ok || json.Unmarshal(raw, &from) != nil || !isNetworkFile(from) {
		if _, ok := conf["plugins"]; !ok {
			return nil // a single plugin's, never ours
		}
		return edit(path, withoutOurs)
	}
	plugins, err := pluginList(path, conf)
	if err != nil {
		return err
	}
	if rest := withoutOurs(plugins); len(rest) == 1 {
		orig := filepath.Join(filepath.Dir(path), from)
		if _, err := os.Stat(orig); errors.Is(err, os.ErrNotExist) {
			var out bytes.Buffer
			if err := json.Indent(&out, rest[0], "", "  "); err != nil {
				return fmt.Errorf("restore %s from %s: %w", orig, path, err)
			}
			if err := writeFile(orig, append(out.Bytes(), '\n'), path); err != nil {
				return err
			}
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove %s, made of %s: %w", path, from, err)
		}
		return nil
	}
	// Plugins were added since: it stays a list.
	return edit(path, withoutOurs)
}

// read parses the network configuration at path.
func read(path string) (map[string]json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CNI network configuration: %w", err)
	}
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, fmt.Errorf("parse CNI network configuration %s: %w", path, err)
	}
	return conf, nil
}

// pluginList returns conf's plugin list (path's).
func pluginList(path string, conf map[string]json.RawMessage) ([]json.RawMessage, error) {
	var plugins []json.RawMessage
	if err := json.Unmarshal(conf["plugins"], &plugins); err != nil {
		return nil, fmt.Errorf("parse the plugin list of %s: %w", path, err)
	}
	return plugins, nil
}

// edit rewrites path's plugin list with change, keeping every other field;
// a file change leaves as it was is not written.
func edit(path string, change func([]json.RawMessage) []json.RawMessage) error {
	conf, err := read(path)
	if err != nil {
		return err
	}
	plugins, err := pluginList(path, conf)
	if err != nil {
		return err
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
	return writeFile(path, append(out, '\n'), path)
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

// writeFile replaces path with data, with modeOf's mode (0644 if it is
// not there).
func writeFile(path string, data []byte, modeOf string) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(modeOf); err == nil {
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
