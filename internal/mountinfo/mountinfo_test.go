package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/sys/fs/bpf`:          "/sys/fs/bpf",
		`/mnt/a\040b`:          "/mnt/a b",
		`/mnt/tab\011x\134y`:   "/mnt/tab\tx\\y",
		`/mnt/trailing\04`:     `/mnt/trailing\04`,
		`/mnt/not-octal\09912`: `/mnt/not-octal\09912`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestList finds the root mount and /proc, as this process sees them.
func TestList(t *testing.T) {
	ms, err := List()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, m := range ms {
		found[m.Point] = m.FSType
	}
	if _, ok := found["/"]; !ok {
		t.Errorf("List() has no mount at /: %+v", ms)
	}
	if found["/proc"] != "proc" {
		t.Errorf("List() has /proc as %q, want proc", found["/proc"])
	}
}
