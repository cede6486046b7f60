package mountinfo

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo (proc(5)).
type Mount struct {
	ID     int
	Point  string
	FSType string
	Shared bool // propagation: a member of a peer group ("shared:N")
}

// List returns the calling process's mounts, parents before children (the
// order of mountinfo).
func List() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var ms []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root point options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 7 || sep < 6 || sep+1 >= len(fields) {
			continue
		}
		id, _ := strconv.Atoi(fields[0])
		m := Mount{ID: id, Point: unescape(fields[4]), FSType: fields[sep+1]}
		for _, opt := range fields[6:sep] {
			if strings.HasPrefix(opt, "shared:") {
				m.Shared = true
			}
		}
		ms = append(ms, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return ms, nil
}

// unescape undoes the octal escapes (\040 for a space) of mountinfo paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
