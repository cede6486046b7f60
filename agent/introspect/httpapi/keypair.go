package httpapi

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
)

// keyPair serves the TCP listener's certificate from its files and loads
// them again when they change, so that a renewed certificate applies
// without a restart: cert-manager renews the Secret, the kubelet updates
// the mounted files, and the next connection gets the new certificate.
//
// Both files are stat'ed at every handshake, which costs little next to the
// handshake's own key exchange and signature, and loaded again when either
// is another file (device, inode: a Secret volume swaps its ..data symlink
// to a new directory, and os.Stat follows the path as it resolves now) or
// changed size or modification time. A pair that does not load, or whose
// key does not match its certificate, is warned about once and the last
// good pair stays served: a handshake never goes without a certificate.
type keyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	loaded pairStamp // the files cert was read from
	failed pairStamp // the files last warned about
}

// fileStamp tells one version of a file from another; the zero value is a
// file that cannot be stat'ed.
type fileStamp struct {
	dev, ino    uint64
	size, mtime int64
}

type pairStamp [2]fileStamp

// loadKeyPair loads the pair at start, where files that do not load refuse
// the start.
func loadKeyPair(certFile, keyFile string, log *slog.Logger) (*keyPair, error) {
	k := &keyPair{certFile: certFile, keyFile: keyFile, log: log}
	st := k.stamp()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	k.cert, k.loaded = &cert, st
	return k, nil
}

// getCertificate is the listener's tls.Config.GetCertificate.
func (k *keyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// Stamped before reading: files changed in between are read again at
	// the next handshake, never missed.
	st := k.stamp()
	if st == k.loaded || st == k.failed {
		return k.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		k.failed = st
		k.log.Warn("introspection certificate files changed but do not load: serving the previous certificate",
			"cert_file", k.certFile, "key_file", k.keyFile, "err", err)
		return k.cert, nil
	}
	k.cert, k.loaded, k.failed = &cert, st, pairStamp{}
	k.log.Info("introspection certificate reloaded", "cert_file", k.certFile, "not_after", cert.Leaf.NotAfter)
	return k.cert, nil
}

func (k *keyPair) stamp() pairStamp {
	return pairStamp{stampFile(k.certFile), stampFile(k.keyFile)}
}

func stampFile(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino // Dev is 32 bits on some architectures
	}
	return s
}
