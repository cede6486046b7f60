package agentproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// reportMsg is the message of the agent's introspection report records.
const reportMsg = "introspection report"

// Record is one JSON log record, its values left encoded: an agent's
// report record is large, and a test reads few keys of any record.
type Record map[string]json.RawMessage

// Msg is the record's message.
func (r Record) Msg() string { return r.Str("msg") }

// Str is the string value of key, or "" when it is absent or not a string.
func (r Record) Str(key string) string {
	var s string
	json.Unmarshal(r[key], &s)
	return s
}

// Listening matches the record an agent logs when its listener (health,
// metrics, proxy, introspection) listens; its "addr" key is the address.
func Listening(listener string) func(Record) bool {
	return func(r Record) bool { return r.Msg() == "listening" && r.Str("listener") == listener }
}

// Log collects an agent's log from a pipe: the lines as text, the JSON
// records, and, set apart because they are large and frequent, the
// introspection reports (a count and the newest).
type Log struct {
	keep    int
	timeout time.Duration

	mu       sync.Mutex
	lines    []string
	records  []Record
	reports  int
	report   json.RawMessage
	grew     chan struct{} // closed and replaced on every line, and at the end
	finished bool
}

// NewLog reads r until it ends. It keeps the last keep lines for Tail
// (zero keeps every line) and every record; timeout bounds its waits.
func NewLog(r io.ReadCloser, keep int, timeout time.Duration) *Log {
	l := &Log{keep: keep, timeout: timeout, grew: make(chan struct{})}
	go l.read(r)
	return l
}

func (l *Log) read(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var rec Record
		json.Unmarshal(sc.Bytes(), &rec) // a non-JSON line (cobra's error) is kept as a line only
		l.mu.Lock()
		if rec.Msg() == reportMsg {
			l.reports++
			l.report = rec["report"]
		} else {
			l.lines = append(l.lines, sc.Text())
			if l.keep > 0 && len(l.lines) > l.keep {
				l.lines = slices.Delete(l.lines, 0, len(l.lines)-l.keep)
			}
			if rec != nil {
				l.records = append(l.records, rec)
			}
		}
		close(l.grew)
		l.grew = make(chan struct{})
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.finished = true
	close(l.grew)
	l.mu.Unlock()
}

// Wait returns the first record that matches, waiting for it until the
// log ends (the agent exited) or the timeout passes.
func (l *Log) Wait(match func(Record) bool) (Record, error) {
	timeout := time.After(l.timeout)
	for {
		l.mu.Lock()
		grew, finished := l.grew, l.finished
		i := slices.IndexFunc(l.records, match)
		var r Record
		if i >= 0 {
			r = l.records[i]
		}
		l.mu.Unlock()
		switch {
		case i >= 0:
			return r, nil
		case finished:
			return nil, errors.New("the agent's log ended without it")
		}
		select {
		case <-grew:
		case <-timeout:
			return nil, fmt.Errorf("not logged within %s", l.timeout)
		}
	}
}

// Count returns how many records match.
func (l *Log) Count(match func(Record) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if match(r) {
			n++
		}
	}
	return n
}

// Tail returns the last n lines kept, reports left out (n <= 0: all).
func (l *Log) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n <= 0 {
		n = len(l.lines)
	}
	return strings.Join(l.lines[max(0, len(l.lines)-n):], "\n")
}

// reportCount is how many introspection reports were logged so far.
func (l *Log) reportCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reports
}

// waitReport returns the newest report once more than seen were logged.
func (l *Log) waitReport(seen int) (json.RawMessage, error) {
	timeout := time.After(l.timeout)
	for {
		l.mu.Lock()
		grew, n, rep, finished := l.grew, l.reports, l.report, l.finished
		l.mu.Unlock()
		switch {
		case n > seen:
			return rep, nil
		case finished:
			return nil, errors.New("the agent exited instead of reporting")
		}
		select {
		case <-grew:
		case <-timeout:
			return nil, fmt.Errorf("no introspection report within %s", l.timeout)
		}
	}
}
