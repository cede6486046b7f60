package translate

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestTruncate: a long message is cut to the limit between runes, so that
// it survives JSON encoding (the status patch) unchanged; cut inside a rune,
// the stray bytes became U+FFFD and the stored message never matched.
func TestTruncate(t *testing.T) {
	const limit = 32768
	cut := limit - len("...")
	// at puts r at byte offset off of a message over the limit.
	at := func(off int, r string) string { return strings.Repeat("a", off) + r + strings.Repeat("b", 100) }
	for _, tc := range []struct {
		name, in string
		wantLen  int // of the result
	}{
		{"short", "no backends", len("no backends")},
		{"at the limit", strings.Repeat("a", limit), limit},
		{"ascii", at(limit, ""), limit},
		{"rune ending before the cut", at(cut-2, "é"), limit},
		{"two-byte rune across the cut", at(cut-1, "é"), limit - 1},
		{"three-byte rune, second byte at the cut", at(cut-1, "€"), limit - 1},
		{"three-byte rune, third byte at the cut", at(cut-2, "€"), limit - 2},
		{"four-byte rune across the cut", at(cut-3, "😀"), limit - 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in)
			if len(got) != tc.wantLen || (len(tc.in) > limit && !strings.HasSuffix(got, "...")) {
				t.Errorf("truncate = %d bytes ending %q, want %d ending ...", len(got), got[len(got)-8:], tc.wantLen)
			}
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back string
			if err := json.Unmarshal(b, &back); err != nil || back != got {
				t.Errorf("after a JSON round trip the message differs (%d bytes, ending %q)", len(back), back[len(back)-8:])
			}
		})
	}
}
