package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestListeners(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0200F40A:1F90 0300F40A:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:3A99 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
`
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tcp"), []byte(tcp), 0o600)
	os.WriteFile(filepath.Join(dir, "tcp6"), []byte(tcp6), 0o600)
	got, err := listeners(filepath.Join(dir, "tcp"))
	if err != nil {
		t.Fatal(err)
	}
	got6, err := listeners(filepath.Join(dir, "tcp6"))
	if err != nil {
		t.Fatal(err)
	}
	// The established socket (st 01) is not a listener.
	if want := []string{"127.0.0.1:15001", "0.0.0.0:8080"}; !slices.Equal(got, want) {
		t.Errorf("listeners(tcp) = %q, want %q", got, want)
	}
	if want := []string{"[::1]:15001"}; !slices.Equal(got6, want) {
		t.Errorf("listeners(tcp6) = %q, want %q", got6, want)
	}
	if got, err := listeners(filepath.Join(dir, "absent")); err != nil || got != nil {
		t.Errorf("listeners(absent) = %q, %v; want none (no IPv6)", got, err)
	}
}
