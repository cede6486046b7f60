package cniconf

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// bridge is a node's network configuration as the test cluster writes it,
// with a field of no plugin's (kept as it is).
const bridge = `{
  "cniVersion": "1.0.0",
  "name": "smnet",
  "disableCheck": true,
  "plugins": [
    {"type": "bridge", "bridge": "smbr0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// config is a node's CNI directories and the plugin to install.
type config struct {
	ConfDir, BinDir, Binary string
	Entry                   map[string]any
}

// install installs the plugin as the agent does.
func install(cfg config) (string, error) {
	if err := InstallBinary(cfg.Binary, cfg.BinDir); err != nil {
		return "", err
	}
	return Chain(cfg.ConfDir, cfg.Entry)
}

func setup(t *testing.T, files map[string]string) config {
	t.Helper()
	dir := t.TempDir()
	cfg := config{ConfDir: filepath.Join(dir, "net.d"), BinDir: filepath.Join(dir, "bin"), Binary: filepath.Join(dir, "plugin"),
		Entry: map[string]any{"socket": "/var/run/sockmesh/cni.sock", "exemptNamespaces": []string{"kube-system"}}}
	for _, d := range []string{cfg.ConfDir, cfg.BinDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(cfg.Binary, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cfg.ConfDir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

func decode(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func mustDecode(s string) map[string]any {
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		panic(err)
	}
	return v
}

// TestInstallUninstall: the entry goes last into the first network
// configuration by name, everything else kept; again, nothing is written;
// Uninstall gives the file back as it was (but for its layout).
func TestInstallUninstall(t *testing.T) {
	other := `{"cniVersion": "1.0.0", "name": "later", "plugins": [{"type": "ptp"}]}`
	cfg := setup(t, map[string]string{"10-smnet.conflist": bridge, "20-later.conflist": other, "README": "not a configuration"})
	path, err := install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cfg.ConfDir, "10-smnet.conflist"); path != want {
		t.Errorf("Install edited %s, want %s", path, want)
	}
	want := mustDecode(bridge)
	want["plugins"] = append(want["plugins"].([]any), map[string]any{
		"type": "sockmesh-cni", "socket": "/var/run/sockmesh/cni.sock", "exemptNamespaces": []any{"kube-system"}})
	if got := decode(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("after Install:\n%v\nwant\n%v", got, want)
	}
	if got := decode(t, filepath.Join(cfg.ConfDir, "20-later.conflist")); !reflect.DeepEqual(got, mustDecode(other)) {
		t.Errorf("a configuration the runtime does not use was changed: %v", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after Install = %v (%v), want 0600 kept", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(cfg.BinDir, PluginType)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("installed binary: %v, %v", fi, err)
	}

	// Again: the file holds the entry as wanted and is not written.
	before, _ := os.Stat(path)
	if _, err := install(cfg); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); !os.SameFile(before, after) {
		t.Error("a second Install wrote the file again")
	}
	// A changed entry (another socket) replaces ours: still one.
	cfg.Entry["socket"] = "/run/other.sock"
	if _, err := install(cfg); err != nil {
		t.Fatal(err)
	}
	plugins := decode(t, path)["plugins"].([]any)
	if len(plugins) != 3 || plugins[2].(map[string]any)["socket"] != "/run/other.sock" {
		t.Errorf("plugins after a changed Install = %v, want one sockmesh-cni entry, last, with the new socket", plugins)
	}

	if err := Uninstall(cfg.ConfDir, cfg.BinDir); err != nil {
		t.Fatal(err)
	}
	if got := decode(t, path); !reflect.DeepEqual(got, mustDecode(bridge)) {
		t.Errorf("after Uninstall:\n%v\nwant\n%v", got, mustDecode(bridge))
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, PluginType)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("binary after Uninstall: %v, want it gone", err)
	}
	if err := Uninstall(cfg.ConfDir, cfg.BinDir); err != nil {
		t.Errorf("a second Uninstall: %v, want nothing to do", err)
	}
	ents, _ := os.ReadDir(cfg.ConfDir)
	if len(ents) != 3 {
		t.Errorf("conf directory holds %v, want the three files (no temporary file left)", ents)
	}
}

// single is a node's network configuration as a single plugin's (.conf).
const single = `{"cniVersion": "0.4.0", "name": "net", "type": "bridge", "bridge": "cni0", "isGateway": true,
  "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}}`

// TestInstallSingle: a single plugin's configuration becomes a .conflist
// of the same name listing it (libcni's reading of a .conf), then the
// entry; Uninstall puts the .conf back as it was (but for its layout).
func TestInstallSingle(t *testing.T) {
	cfg := setup(t, map[string]string{"10-net.conf": single})
	path, err := install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(cfg.ConfDir, "10-net.conf")
	if want := conf + "list"; path != want {
		t.Errorf("Install chained into %s, want %s", path, want)
	}
	want := map[string]any{"cniVersion": "0.4.0", "name": "net", convertedFrom: "10-net.conf", "plugins": []any{mustDecode(single),
		map[string]any{"type": "sockmesh-cni", "socket": "/var/run/sockmesh/cni.sock", "exemptNamespaces": []any{"kube-system"}}}}
	if got := decode(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("after Install:\n%v\nwant\n%v", got, want)
	}
	if _, err := os.Stat(conf); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the .conf after Install: %v, want it gone (the runtime would use it, first by name)", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of the .conflist = %v (%v), want the .conf's, 0600", fi.Mode(), err)
	}
	before, _ := os.Stat(path)
	if again, err := install(cfg); err != nil || again != path {
		t.Fatalf("a second Install = %s, %v", again, err)
	}
	if after, _ := os.Stat(path); !os.SameFile(before, after) {
		t.Error("a second Install wrote the file again")
	}

	if err := Uninstall(cfg.ConfDir, cfg.BinDir); err != nil {
		t.Fatal(err)
	}
	if got := decode(t, conf); !reflect.DeepEqual(got, mustDecode(single)) {
		t.Errorf("after Uninstall:\n%v\nwant\n%v", got, mustDecode(single))
	}
	if ents, _ := os.ReadDir(cfg.ConfDir); len(ents) != 1 {
		t.Errorf("conf directory holds %v, want the .conf alone", ents)
	}
	if fi, err := os.Stat(conf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of the restored .conf = %v (%v), want 0600", fi.Mode(), err)
	}
}

// TestInstallSingleRewritten: when the network plugin writes its .conf
// again (it would, not knowing of ours), Install makes it the .conflist
// again; Uninstall then leaves the plugin's newest .conf.
func TestInstallSingleRewritten(t *testing.T) {
	cfg := setup(t, map[string]string{"10-net.conf": single})
	if _, err := install(cfg); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(cfg.ConfDir, "10-net.conf")
	rewritten := strings.Replace(single, "cni0", "cni1", 1)
	if err := os.WriteFile(conf, []byte(rewritten), 0o600); err != nil {
		t.Fatal(err)
	}
	path, err := install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := decode(t, path)["plugins"].([]any)[0]; !reflect.DeepEqual(got, mustDecode(rewritten)) {
		t.Errorf("first plugin after the .conf was rewritten = %v, want %v", got, mustDecode(rewritten))
	}
	if _, err := os.Stat(conf); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the rewritten .conf after Install: %v, want it gone", err)
	}
	if err := os.WriteFile(conf, []byte(single), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(cfg.ConfDir, cfg.BinDir); err != nil {
		t.Fatal(err)
	}
	if got := decode(t, conf); !reflect.DeepEqual(got, mustDecode(single)) {
		t.Errorf("the .conf after Uninstall = %v, want the network plugin's newest", got)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the .conflist after Uninstall: %v, want it gone", err)
	}
}

func TestInstallErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"no configuration yet", nil, ErrNoNetwork.Error()},
		{"a single-plugin .conf shadowing a .conflist", map[string]string{"10-net.conf": single, "10-net.conflist": bridge}, "10-net.conflist exists"},
		{"neither a list nor a plugin", map[string]string{"10-net.conf": `{"cniVersion": "0.4.0", "name": "n"}`}, "neither a plugin list nor a plugin type"},
		{"malformed", map[string]string{"10-net.conflist": `{"plugins": [`}, "parse CNI network configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := setup(t, tc.files)
			_, err := install(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install = %v, want an error containing %q", err, tc.want)
			}
			for name, data := range tc.files {
				if got, _ := os.ReadFile(filepath.Join(cfg.ConfDir, name)); string(got) != data {
					t.Errorf("%s changed to %q", name, got)
				}
			}
		})
	}
}
