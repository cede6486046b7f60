package agentproc

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestLog feeds a log through a pipe: records are found, counted and
// tailed; reports are set apart; a wait for what never comes ends with the
// log.
func TestLog(t *testing.T) {
	r, w := io.Pipe()
	l := NewLog(r, 3, time.Minute)
	io.WriteString(w, `{"msg":"listening","listener":"health","addr":"127.0.0.1:1"}`+"\n")
	io.WriteString(w, "Error: not JSON\n")
	io.WriteString(w, `{"msg":"introspection report","report":{"node":"n1"}}`+"\n")
	io.WriteString(w, `{"msg":"adopted pinned link"}`+"\n"+`{"msg":"adopted pinned link","link":"b"}`+"\n")

	rec, err := l.Wait(Listening("health"))
	if err != nil || rec.Str("addr") != "127.0.0.1:1" {
		t.Fatalf("Wait(health listener) = %v, %v", rec, err)
	}
	// The last line: records are read in order, so every line is in.
	if _, err := l.Wait(func(r Record) bool { return r.Str("link") == "b" }); err != nil {
		t.Fatal(err)
	}
	if n := l.Count(func(r Record) bool { return r.Msg() == "adopted pinned link" }); n != 2 {
		t.Errorf("Count(adopted) = %d, want 2", n)
	}
	if n := l.Count(func(r Record) bool { return r.Msg() == "introspection report" }); n != 0 {
		t.Errorf("reports counted as records: %d", n)
	}
	if got, err := l.waitReport(0); err != nil || string(got) != `{"node":"n1"}` {
		t.Errorf("waitReport(0) = %s, %v", got, err)
	}
	// Three lines kept, the report not among them.
	if got, want := l.Tail(0), "Error: not JSON\n"+`{"msg":"adopted pinned link"}`+"\n"+`{"msg":"adopted pinned link","link":"b"}`; got != want {
		t.Errorf("Tail(0) = %q, want %q", got, want)
	}
	w.Close()
	if _, err := l.Wait(func(r Record) bool { return r.Msg() == "stopped" }); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("Wait after the log ended = %v, want an error saying so", err)
	}
	if _, err := l.waitReport(1); err == nil {
		t.Error("waitReport after the log ended returned no error")
	}
}
