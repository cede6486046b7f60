package cniwire

import (
	"strings"
	"testing"
)

// TestRecord: a sandbox's record is a file of the directory, named by its
// ID; an ID that is no plain file name names none.
func TestRecord(t *testing.T) {
	if got := RecordDir("/run/sockmesh/cni/cni.sock"); got != "/run/sockmesh/cni/handovers" {
		t.Errorf("RecordDir = %s, want /run/sockmesh/cni/handovers", got)
	}
	for _, tc := range []struct{ sandbox, want string }{
		{"3f9a0c", "/d/3f9a0c.json"},
		{"", ""},
		{"..", ""},
		{".hidden", ""},
		{"../../etc/passwd", ""},
		{"a/b", ""},
	} {
		got, err := Record("/d", tc.sandbox)
		if got != tc.want || (err == nil) != (tc.want != "") || err != nil && !strings.Contains(err.Error(), "no file name") {
			t.Errorf("Record(/d, %q) = %q, %v; want %q", tc.sandbox, got, err, tc.want)
		}
	}
}
