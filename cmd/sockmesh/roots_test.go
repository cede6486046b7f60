package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"testing"
)

// TestSystemRootsWithoutAStore runs this test binary again with no trust
// store where Go looks for one, as in the shipped image (no base layer):
// a public root, ISRG Root X1, must still verify, or every backend whose
// policy says wellKnownCACertificates: System would get a 502 while its
// status says Accepted.
func TestSystemRootsWithoutAStore(t *testing.T) {
	if os.Getenv("SOCKMESH_TEST_NO_STORE") == "1" {
		verifyPublicRoot(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSystemRootsWithoutAStore$", "-test.v")
	cmd.Env = append(os.Environ(), "SOCKMESH_TEST_NO_STORE=1",
		"SSL_CERT_FILE=/nonexistent/sockmesh-test", "SSL_CERT_DIR=/nonexistent/sockmesh-test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("without a trust store: %v\n%s", err, out)
	}
}

func verifyPublicRoot(t *testing.T) {
	b, err := os.ReadFile("testdata/isrg-root-x1.pem")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("testdata/isrg-root-x1.pem: no PEM block")
	}
	root, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	// Roots unset: the system pool, as upstreamtls uses for System.
	if _, err := root.Verify(x509.VerifyOptions{}); err != nil {
		t.Fatalf("ISRG Root X1 against the system roots: %v", err)
	}
}
