package tlsvalidation_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate/tlsvalidation"
)

// objects is an Objects over fixed maps.
type objects struct {
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	bundles    map[string]*certificatesv1.ClusterTrustBundle
}

func (o objects) ConfigMap(ns, name string) *corev1.ConfigMap { return o.configMaps[ns+"/"+name] }
func (o objects) Secret(ns, name string) *corev1.Secret       { return o.secrets[ns+"/"+name] }
func (o objects) ClusterTrustBundle(name string) *certificatesv1.ClusterTrustBundle {
	return o.bundles[name]
}

// testNow is within the validity of testdata/certs' certificates.
var testNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func cert(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/certs/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestValidateBundle checks the bundle a ClusterTrustBundle gives: text
// between blocks (which consumers may drop) is ignored, certificates are
// kept in order, re-encoded, and duplicates dropped.
func TestValidateBundle(t *testing.T) {
	ca, ca2 := cert(t, "ca.pem"), cert(t, "ca2.pem")
	objs := objects{bundles: map[string]*certificatesv1.ClusterTrustBundle{
		"corp": {ObjectMeta: metav1.ObjectMeta{Name: "corp"}, Spec: certificatesv1.ClusterTrustBundleSpec{
			TrustBundle: "# corporate roots\n" + ca + "\nsome words\n" + ca2 + ca,
		}},
	}}
	v := &gwv1.BackendTLSPolicyValidation{
		Hostname:          "db.example.com",
		CACertificateRefs: []gwv1.LocalObjectReference{{Group: "certificates.k8s.io", Kind: "ClusterTrustBundle", Name: "corp"}},
	}
	r := tlsvalidation.Validate(v, "validation", "apps", objs, false, testNow)
	if r.Accepted != nil || r.ResolvedRefs != nil {
		t.Fatalf("Validate = Accepted %v, ResolvedRefs %v; want both nil", r.Accepted, r.ResolvedRefs)
	}
	if want := ca + ca2; r.TLS.RootsPEM != want {
		t.Errorf("RootsPEM =\n%s\nwant\n%s", r.TLS.RootsPEM, want)
	}
	if r.TLS.ServerName != "db.example.com" || r.TLS.SystemRoots {
		t.Errorf("TLS = %+v, want ServerName db.example.com without system roots", r.TLS)
	}

	r = tlsvalidation.Validate(v, "validation", "apps", objs, true, testNow)
	if r.ResolvedRefs == nil || r.ResolvedRefs.Reason != tlsvalidation.ReasonInvalidKind ||
		r.Accepted == nil || r.Accepted.Reason != tlsvalidation.ReasonNoValidCACertificate {
		t.Errorf("Validate without the ClusterTrustBundle API = Accepted %v, ResolvedRefs %v; want NoValidCACertificate, InvalidKind", r.Accepted, r.ResolvedRefs)
	}
}

// TestValidatePartlyBrokenBundle: a ca.crt whose certificates are not all
// readable is an invalid reference, whatever else it holds. encoding/pem
// skips a block it cannot decode (a corrupted or truncated certificate) and
// returns the next one, so such a bundle was taken as the certificates
// that survived: ResolvedRefs said all was resolved while a CA the owner
// listed was gone, and only its backends' handshakes said otherwise.
func TestValidatePartlyBrokenBundle(t *testing.T) {
	ca, ca2 := cert(t, "ca.pem"), cert(t, "ca2.pem")
	lines := strings.SplitAfter(ca, "\n")
	corrupted := strings.Join(slices.Concat(lines[:2], []string{"!!" + lines[2][2:]}, lines[3:]), "")
	truncated := strings.Join(lines[:len(lines)-3], "") // no END line
	for name, bundle := range map[string]string{
		"corrupted first":  corrupted + ca2,
		"corrupted last":   ca2 + corrupted,
		"truncated first":  truncated + ca2,
		"truncated last":   ca2 + truncated,
		"corrupted middle": ca + corrupted + ca2,
	} {
		objs := objects{configMaps: map[string]*corev1.ConfigMap{"apps/ca": {Data: map[string]string{tlsvalidation.CAKey: bundle}}}}
		v := &gwv1.BackendTLSPolicyValidation{
			Hostname:          "db.example.com",
			CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "ca"}},
		}
		r := tlsvalidation.Validate(v, "validation", "apps", objs, false, testNow)
		if r.ResolvedRefs == nil || r.ResolvedRefs.Reason != tlsvalidation.ReasonInvalidCACertificateRef ||
			r.Accepted == nil || r.Accepted.Reason != tlsvalidation.ReasonNoValidCACertificate {
			t.Errorf("%s: Validate = Accepted %v, ResolvedRefs %v (roots %d bytes); want NoValidCACertificate, InvalidCACertificateRef",
				name, r.Accepted, r.ResolvedRefs, len(r.TLS.RootsPEM))
		}
	}
}

// TestValidateNames: the hostname (the SNI) and Hostname subjectAltNames
// are DNS names as the API's types spell them — lowercase, no trailing
// dot, never an address (RFC 6066 §3 allows none as SNI) — with a wildcard
// only as a subjectAltName's whole first label.
func TestValidateNames(t *testing.T) {
	for _, c := range []struct {
		hostname, san string // san "" for none
		ok            bool
	}{
		{"db.example.com", "", true},
		{"db.example.com.", "", false},
		{"DB.example.com", "", false},
		{"10.0.0.1", "", false},
		{"::1", "", false},
		{"*.example.com", "", false},
		{"db.example.com", "*.example.com", true},
		{"db.example.com", "db.example.com.", false},
		{"db.example.com", "a.*.example.com", false},
		{"db.example.com", "d*.example.com", false},
		{"db.example.com", "*", false},
		{"db.example.com", "fd00::1", false},
	} {
		v := &gwv1.BackendTLSPolicyValidation{Hostname: gwv1.PreciseHostname(c.hostname), WellKnownCACertificates: ptr(gwv1.WellKnownCACertificatesSystem)}
		if c.san != "" {
			v.SubjectAltNames = []gwv1.SubjectAltName{{Type: gwv1.HostnameSubjectAltNameType, Hostname: gwv1.Hostname(c.san)}}
		}
		r := tlsvalidation.Validate(v, "validation", "apps", objects{}, false, testNow)
		if ok := r.Accepted == nil; ok != c.ok || !ok && r.Accepted.Reason != tlsvalidation.ReasonInvalid {
			t.Errorf("hostname %q, subjectAltName %q: Accepted = %v, want valid %v (else Invalid)", c.hostname, c.san, r.Accepted, c.ok)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestApplyOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    map[gwv1.AnnotationKey]gwv1.AnnotationValue
		want    snapshot.TLS
		wantErr string
	}{
		{name: "none"},
		{name: "other implementations' keys", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"example.com/min-tls-version": "1.0"}},
		// Un-prefixed names are reserved for keys Gateway API defines:
		// ignoring one would be silently weaker than the policy asks.
		{name: "unprefixed key", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"min-tls-version": "1.3"}, wantErr: "options[min-tls-version] is unprefixed"},
		{name: "sockmesh key in capitals", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"Sockmesh.io/min-tls-version": "1.3"}, wantErr: "options[Sockmesh.io/min-tls-version] is not an option sockmesh knows"},
		{
			name: "all",
			opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{
				tlsvalidation.OptionMinTLSVersion: "TLSv1.2", tlsvalidation.OptionMaxTLSVersion: "1.3",
				tlsvalidation.OptionCipherSuites: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
				tlsvalidation.OptionCurves:       "p-384, X25519", tlsvalidation.OptionALPN: "http/1.1",
			},
			want: snapshot.TLS{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13,
				CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384},
				Curves:       []tls.CurveID{tls.CurveP384, tls.X25519}, ALPN: []string{"http/1.1"}},
		},
		{name: "TLS 1.1", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{tlsvalidation.OptionMaxTLSVersion: "1.1"}, wantErr: `options[sockmesh.io/max-tls-version] "1.1" is not a supported TLS version`},
		{name: "insecure suite", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{tlsvalidation.OptionCipherSuites: "TLS_RSA_WITH_3DES_EDE_CBC_SHA"}, wantErr: "is insecure and refused"},
		{name: "unknown sockmesh key", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"sockmesh.io/skip-verify": "true"}, wantErr: "options[sockmesh.io/skip-verify] is not an option sockmesh knows"},
		// A TLS 1.2 handshake with ML-KEM groups alone fails every time.
		{name: "ML-KEM only, TLS 1.2", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{tlsvalidation.OptionMaxTLSVersion: "1.2", tlsvalidation.OptionCurves: "X25519MLKEM768, MLKEM1024"}, wantErr: "options[sockmesh.io/curves] lists only ML-KEM groups"},
		{name: "ML-KEM and X25519, TLS 1.2", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{tlsvalidation.OptionMaxTLSVersion: "1.2", tlsvalidation.OptionCurves: "X25519MLKEM768,X25519"},
			want: snapshot.TLS{MaxVersion: tls.VersionTLS12, Curves: []tls.CurveID{tls.X25519MLKEM768, tls.X25519}}},
		{name: "long ALPN", opts: map[gwv1.AnnotationKey]gwv1.AnnotationValue{tlsvalidation.OptionALPN: gwv1.AnnotationValue(strings.Repeat("x", 256))}, wantErr: "longer than 255 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got snapshot.TLS
			p := tlsvalidation.ApplyOptions(tc.opts, &got)
			if tc.wantErr != "" {
				if p == nil || p.Reason != tlsvalidation.ReasonInvalid || !strings.Contains(p.Message, tc.wantErr) {
					t.Fatalf("ApplyOptions(%v) = %v, want Invalid containing %q", tc.opts, p, tc.wantErr)
				}
				return
			}
			if p != nil {
				t.Fatalf("ApplyOptions(%v) = %v, want nil", tc.opts, p)
			}
			if got.MinVersion != tc.want.MinVersion || got.MaxVersion != tc.want.MaxVersion ||
				!slices.Equal(got.CipherSuites, tc.want.CipherSuites) || !slices.Equal(got.Curves, tc.want.Curves) ||
				!slices.Equal(got.ALPN, tc.want.ALPN) {
				t.Errorf("ApplyOptions(%v) set %+v, want %+v", tc.opts, got, tc.want)
			}
		})
	}
}

// TestClientCertificate checks what is wrong with a clientCertificateRef's
// Secret is refused with a message that says what, and never carries key
// material: a key that is not the certificate's, an encrypted key (the
// proxy has no passphrase; also PKCS #8's EncryptedPrivateKeyInfo in a
// block labelled plain PRIVATE KEY, which got the parser's message), a
// certificate expired or not yet valid at
// translation (a backend refuses it, and the app saw only a handshake
// failure while status said all was resolved). ChangesAt is when the
// judgement of its validity flips: just after NotAfter for a valid
// certificate, NotBefore for one not yet valid, never for one expired or
// refused for something else.
func TestClientCertificate(t *testing.T) {
	key := cert(t, "client-key.pem")
	keyBody := strings.Split(key, "\n")[1]
	crt := []byte(cert(t, "client.pem"))
	// What an encrypted key holds is no PKCS #8 (or PKCS #1) structure.
	sealed := base64.StdEncoding.EncodeToString([]byte("encrypted key bytes"))
	encrypted := encryptPKCS8(t, key, "passphrase")
	// client.pem is valid from notBefore to notAfter, both included.
	notBefore, notAfter := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2046, 1, 1, 0, 0, 0, 0, time.UTC)
	valid := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	pair := map[string][]byte{"tls.crt": crt, "tls.key": []byte(key)}
	for _, c := range []struct {
		name    string
		data    map[string][]byte
		now     time.Time
		want    string    // in the message; "" for a valid pair
		changes time.Time // ChangesAt
	}{
		{"valid", pair, valid, "", notAfter.Add(time.Nanosecond)},
		{"valid at notBefore", pair, notBefore, "", notAfter.Add(time.Nanosecond)},
		{"valid at notAfter", pair, notAfter, "", notAfter.Add(time.Nanosecond)},
		{"swapped", map[string][]byte{"tls.crt": []byte(key), "tls.key": crt}, valid, "not a valid key pair", time.Time{}},
		{"mismatch", map[string][]byte{"tls.crt": crt, "tls.key": []byte(cert(t, "other-key.pem"))}, valid, "not a valid key pair", time.Time{}},
		{"garbage", map[string][]byte{"tls.crt": crt, "tls.key": []byte("-----BEGIN PRIVATE KEY-----\n" + keyBody + "x\n-----END PRIVATE KEY-----\n")}, valid, "not a valid key pair", time.Time{}},
		{"encrypted PKCS #8", map[string][]byte{"tls.crt": crt,
			"tls.key": []byte("-----BEGIN ENCRYPTED PRIVATE KEY-----\n" + sealed + "\n-----END ENCRYPTED PRIVATE KEY-----\n")}, valid, "tls.key is encrypted", time.Time{}},
		{"encrypted PKCS #8 labelled PRIVATE KEY", map[string][]byte{"tls.crt": crt,
			"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: encrypted})}, valid, "tls.key is encrypted, and encrypted keys are not supported", time.Time{}},
		{"encrypted PEM (RFC 1421)", map[string][]byte{"tls.crt": crt,
			"tls.key": []byte("-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\n" + sealed + "\n-----END EC PRIVATE KEY-----\n")}, valid, "tls.key is encrypted", time.Time{}},
		{"expired", pair, time.Date(2046, 6, 1, 0, 0, 0, 0, time.UTC), "expired at 2046-01-01T00:00:00Z", time.Time{}},
		{"expired a nanosecond ago", pair, notAfter.Add(time.Nanosecond), "expired at 2046-01-01T00:00:00Z", time.Time{}},
		{"not yet valid", pair, time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), "not valid before 2026-01-01T00:00:00Z", notBefore},
		{"valid in a nanosecond", pair, notBefore.Add(-time.Nanosecond), "not valid before 2026-01-01T00:00:00Z", notBefore},
	} {
		objs := objects{secrets: map[string]*corev1.Secret{"apps/c": {Data: c.data}}}
		got, p := tlsvalidation.ClientCertificate(&gwv1.SecretObjectReference{Name: "c"}, "apps", objs, refuseAll, c.now)
		if !got.ChangesAt.Equal(c.changes) {
			t.Errorf("%s: ClientCertificate at %s: ChangesAt %s, want %s", c.name, c.now, got.ChangesAt, c.changes)
		}
		if c.want == "" {
			if p != nil || got.CertPEM != string(crt) || got.KeyPEM != key {
				t.Errorf("%s: ClientCertificate = %q, %q, %v; want the pair", c.name, got.CertPEM, got.KeyPEM, p)
			}
			continue
		}
		if p == nil || p.Reason != tlsvalidation.ReasonInvalidCertificateRef || !strings.Contains(p.Message, c.want) {
			t.Errorf("%s: ClientCertificate = %v, want InvalidCertificateRef saying %q", c.name, p, c.want)
			continue
		}
		if got.CertPEM != "" || got.KeyPEM != "" {
			t.Errorf("%s: ClientCertificate refused the pair but returned it", c.name)
		}
		if strings.Contains(p.Message, keyBody[:20]) || strings.Contains(p.Message, sealed[:12]) ||
			strings.Contains(p.Message, base64.StdEncoding.EncodeToString(encrypted)[:20]) {
			t.Errorf("%s: message leaks key material: %s", c.name, p.Message)
		}
	}
}

// refuseAll is a referrer's ReferenceGrant check that no grant passes.
func refuseAll(string, string) bool { return false }

// TestClientCertificateOtherNamespace: a Secret in another namespace is
// used when the referrer's ReferenceGrant check allows it (a
// SecretObjectReference's namespace "requires a ReferenceGrant in the
// referent namespace"), and is RefNotPermitted, unread, when it does not.
func TestClientCertificateOtherNamespace(t *testing.T) {
	crt, key := cert(t, "client.pem"), cert(t, "client-key.pem")
	objs := objects{secrets: map[string]*corev1.Secret{"certs/c": {Data: map[string][]byte{"tls.crt": []byte(crt), "tls.key": []byte(key)}}}}
	certs := gwv1.Namespace("certs")
	ref := &gwv1.SecretObjectReference{Name: "c", Namespace: &certs}
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	var asked []string
	granted := func(namespace, name string) bool {
		asked = append(asked, namespace+"/"+name)
		return true
	}
	if got, p := tlsvalidation.ClientCertificate(ref, "apps", objs, granted, now); p != nil || got.CertPEM != crt {
		t.Errorf("granted: ClientCertificate = %q, %v; want certs/c's pair", got.CertPEM, p)
	}
	if len(asked) != 1 || asked[0] != "certs/c" {
		t.Errorf("granted asked for %v, want [certs/c]", asked)
	}
	got, p := tlsvalidation.ClientCertificate(ref, "apps", objs, refuseAll, now)
	const want = "clientCertificateRef Secret certs/c: no ReferenceGrant in namespace certs allows references to it from namespace apps"
	if p == nil || p.Reason != tlsvalidation.ReasonRefNotPermitted || p.Message != want || got.CertPEM != "" {
		t.Errorf("not granted: ClientCertificate = %q, %+v; want RefNotPermitted %q", got.CertPEM, p, want)
	}
}

// encryptPKCS8 encrypts the PKCS #8 key in keyPEM as OpenSSL's
// `openssl pkcs8 -topk8 -v2 aes-256-cbc -v2prf hmacWithSHA256` does: an
// EncryptedPrivateKeyInfo (RFC 5958 §3) with PBES2 (RFC 8018 §6.2),
// PBKDF2-HMAC-SHA256 and AES-256-CBC. It returns the DER.
func encryptPKCS8(t *testing.T, keyPEM, passphrase string) []byte {
	t.Helper()
	block, _ := pem.Decode([]byte(keyPEM))
	salt, iv := make([]byte, 16), make([]byte, aes.BlockSize)
	rand.Read(salt)
	rand.Read(iv)
	const iterations = 2048
	k, err := pbkdf2.Key(sha256.New, passphrase, salt, iterations, 32)
	if err != nil {
		t.Fatal(err)
	}
	c, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	pad := aes.BlockSize - len(block.Bytes)%aes.BlockSize // PKCS #7 padding (RFC 8018 §6.1.1)
	data := append(slices.Clone(block.Bytes), bytes.Repeat([]byte{byte(pad)}, pad)...)
	cipher.NewCBCEncrypter(c, iv).CryptBlocks(data, data)

	type algorithm struct {
		OID    asn1.ObjectIdentifier
		Params any
	}
	type pbkdf2Params struct {
		Salt       []byte
		Iterations int
		PRF        algorithm
	}
	type pbes2Params struct {
		KDF, Scheme algorithm
	}
	der, err := asn1.Marshal(struct {
		Algorithm algorithm
		Data      []byte
	}{
		Algorithm: algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 13}, pbes2Params{ // PBES2
			KDF: algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 12}, pbkdf2Params{ // PBKDF2
				Salt: salt, Iterations: iterations,
				PRF: algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 9}, asn1.NullRawValue}, // hmacWithSHA256
			}},
			Scheme: algorithm{asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 42}, iv}, // aes256-CBC
		}},
		Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// caValid makes a self-signed CA certificate valid from notBefore to
// notAfter, as PEM.
func caValid(t *testing.T, cn string, notBefore, notAfter time.Time) string {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestValidateCAValidity: a CA reference none of whose certificates is
// valid now is invalid, and says when its certificate expired or becomes
// valid (a chain through it fails in the proxy, crypto/x509 checking its
// roots' validity too; status said Accepted and ResolvedRefs while every
// handshake failed). One valid certificate keeps a reference valid, its
// expired ones in the bundle (a CA rotation). ChangesAt is when a
// reference's judgement flips: just after the end of the run of validity
// periods now is in, or the next NotBefore while none is valid.
func TestValidateCAValidity(t *testing.T) {
	day := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }
	now := day(2026, 5, 1)
	current := caValid(t, "current", day(2026, 1, 1), day(2027, 1, 1))
	expired := caValid(t, "expired", day(2025, 1, 1), day(2026, 1, 1))
	future := caValid(t, "future", day(2026, 7, 1), day(2027, 7, 1))
	endsAtNow := caValid(t, "ends now", day(2025, 1, 1), now)
	overlaps := caValid(t, "overlaps", day(2026, 12, 1), day(2028, 1, 1))
	// Both ends belong to a period (X.509 times are whole seconds): adjoins
	// starts at the instant overlaps ends, and no instant between them
	// finds neither valid.
	adjoins := caValid(t, "adjoins", day(2028, 1, 1), day(2029, 1, 1))
	expired2 := caValid(t, "expired 2", day(2024, 1, 1), day(2025, 6, 1))
	const outside = tlsvalidation.ReasonCACertificateOutsideValidity
	for _, c := range []struct {
		name     string
		bundles  []string // one ConfigMap each; "" names a missing one
		roots    []string // "" for none
		accepted string   // Accepted's reason, "" when nil
		resolved string   // ResolvedRefs' reason, "" when nil
		message  string   // in ResolvedRefs' message
		changes  time.Time
	}{
		{name: "valid", bundles: []string{current}, roots: []string{current}, changes: day(2027, 1, 1).Add(time.Nanosecond)},
		{name: "valid until now", bundles: []string{endsAtNow}, roots: []string{endsAtNow}, changes: now.Add(time.Nanosecond)},
		{name: "expired", bundles: []string{expired}, accepted: tlsvalidation.ReasonNoValidCACertificate, resolved: outside,
			message: "ConfigMap apps/ca0: the certificate in ca.crt (CN=expired) expired at 2026-01-01T00:00:00Z; put a currently valid CA certificate there"},
		{name: "not yet valid", bundles: []string{future}, accepted: tlsvalidation.ReasonNoValidCACertificate, resolved: outside,
			message: "(CN=future) is not valid before 2026-07-01T00:00:00Z", changes: day(2026, 7, 1)},
		{name: "all expired", bundles: []string{expired + expired2}, accepted: tlsvalidation.ReasonNoValidCACertificate, resolved: outside,
			message: "all 2 certificates in ca.crt have expired, the last at 2026-01-01T00:00:00Z"},
		{name: "none valid yet", bundles: []string{expired + future}, accepted: tlsvalidation.ReasonNoValidCACertificate, resolved: outside,
			message: "none of the 2 certificates in ca.crt is valid now; the next becomes valid at 2026-07-01T00:00:00Z", changes: day(2026, 7, 1)},
		{name: "rotation", bundles: []string{expired + current}, roots: []string{expired + current}, changes: day(2027, 1, 1).Add(time.Nanosecond)},
		{name: "gap ahead", bundles: []string{endsAtNow + future}, roots: []string{endsAtNow + future}, changes: now.Add(time.Nanosecond)},
		{name: "overlapping and adjoining", bundles: []string{adjoins + overlaps + current}, roots: []string{adjoins + overlaps + current},
			changes: day(2029, 1, 1).Add(time.Nanosecond)},
		{name: "one of two references", bundles: []string{expired, current}, roots: []string{current}, resolved: outside,
			message: "ConfigMap apps/ca0: the certificate in ca.crt (CN=expired) expired", changes: day(2027, 1, 1).Add(time.Nanosecond)},
		{name: "missing beside expired", bundles: []string{"", future}, accepted: tlsvalidation.ReasonNoValidCACertificate,
			resolved: tlsvalidation.ReasonInvalidCACertificateRef, message: "ConfigMap apps/ca0: not found; ConfigMap apps/ca1: the certificate", changes: day(2026, 7, 1)},
	} {
		objs := objects{configMaps: map[string]*corev1.ConfigMap{}}
		v := &gwv1.BackendTLSPolicyValidation{Hostname: "db.example.com"}
		for i, b := range c.bundles {
			name := fmt.Sprintf("ca%d", i)
			if b != "" {
				objs.configMaps["apps/"+name] = &corev1.ConfigMap{Data: map[string]string{tlsvalidation.CAKey: b}}
			}
			v.CACertificateRefs = append(v.CACertificateRefs, gwv1.LocalObjectReference{Kind: "ConfigMap", Name: gwv1.ObjectName(name)})
		}
		r := tlsvalidation.Validate(v, "validation", "apps", objs, false, now)
		reason := func(p *tlsvalidation.Problem) string {
			if p == nil {
				return ""
			}
			return p.Reason
		}
		if reason(r.Accepted) != c.accepted || reason(r.ResolvedRefs) != c.resolved {
			t.Errorf("%s: Accepted %v, ResolvedRefs %v; want reasons %q, %q", c.name, r.Accepted, r.ResolvedRefs, c.accepted, c.resolved)
		}
		if c.message != "" && (r.ResolvedRefs == nil || !strings.Contains(r.ResolvedRefs.Message, c.message)) {
			t.Errorf("%s: ResolvedRefs %v, want its message to say %q", c.name, r.ResolvedRefs, c.message)
		}
		if want := strings.Join(c.roots, ""); r.TLS.RootsPEM != want {
			t.Errorf("%s: RootsPEM holds %d bytes, want %d", c.name, len(r.TLS.RootsPEM), len(want))
		}
		if !r.ChangesAt.Equal(c.changes) {
			t.Errorf("%s: ChangesAt %s, want %s", c.name, r.ChangesAt, c.changes)
		}
	}
}
